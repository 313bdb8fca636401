"""SFT of a policy on interventions, takeovers and demonstrations through TRL's SFTTrainer: one example per imitated
turn with the policy's own prompt, loss on the person's tokens only, resume and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune.policy_model import load_policy_model
from reward_models.finetune.sft import SFTConfig, main, sft_examples, sft_trainer
from reward_models.finetune.turn_batches import pad_turns
from reward_models.policy.model import save_policy
from reward_models.policy.turns import TurnEncoding, render_prompt
from simulation.episodes import scripted_episodes
from simulation.oracle_data import intervention_sft_rows, write_jsonl
from tests.launch import command_help, run_command
from tests.reward_models import tool_chat
from tests.reward_models.reporters import RecordingReporter, assert_finished_returns_summary, resumed_after_cancel

SMALL_GRID = {"size": 4, "max_steps": 6}
TINY = {"environment_config": SMALL_GRID, "eval_tasks": 0, "batch_size": 8, "learning_rate": 1e-3, "logging_steps": 1}


@pytest.fixture(scope="module")
def episodes():
    return scripted_episodes(30, per_task=2, noises=(0.5, 0.9), seed=3, env_config=SMALL_GRID)


@pytest.fixture(scope="module")
def rows(episodes) -> list[dict]:
    """Intervention corrections, and one demonstration (a whole trajectory played by a person)."""
    demonstration = {"messages": episodes[0].messages, "tools": [], "source": "demonstration", "step_index": None}
    return [*intervention_sft_rows(episodes), {**demonstration, "trajectory_id": 1, "task_id": episodes[0].task_id}]


@pytest.fixture(scope="module")
def rows_path(rows, tmp_path_factory) -> Path:
    return write_jsonl(rows, tmp_path_factory.mktemp("sft") / "sft.jsonl")


def make_config(policy: Path, data: Path, output_dir: Path, **overrides) -> SFTConfig:
    values = {**TINY, "policy_path": str(policy), "data_path": str(data), "output_dir": str(output_dir), **overrides}
    return config_from_dict(SFTConfig, values)


def test_only_the_turns_from_the_intervention_on_are_imitated_each_after_the_policys_own_prompt(
    tiny_policy_dir, rows, tmp_path
):
    loaded = load_policy_model(tiny_policy_dir)
    windowed = save_policy(loaded.model, loaded.tokenizer, tmp_path / "w", history_window=1, max_new_tokens=12)
    tokenizer = load_policy_model(windowed).tokenizer
    row = next(row for row in rows if row["source"] == "intervention" and row["step_index"] >= 1)
    examples, used = sft_examples([row], tokenizer, history_window=1, sources=["intervention"], max_length=1024)
    assert used == {"intervention": 1}
    messages = row["messages"]
    # Shown one previous turn: the instruction, the previous observation and turn, then the current observation.
    shown = [messages[0], *messages[-4:-1]]
    assert [message["role"] for message in shown] == ["system", "user", "assistant", "user"]
    prompt = tokenizer(render_prompt(tokenizer, shown), add_special_tokens=False)["input_ids"]
    completion = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    # One example: the correction. The policy's own steps before it are context, never targets.
    assert examples == [{"input_ids": prompt + completion, "labels": [-100] * len(prompt) + completion}]

    demonstration = rows[-1]
    examples, used = sft_examples([demonstration], tokenizer, 1, ["demonstration"], 1024)
    assert used == {"demonstration": 1}
    assert len(examples) == sum(message["role"] == "assistant" for message in demonstration["messages"])
    assert sft_examples([demonstration], tokenizer, 1, ["intervention"], 1024) == ([], {})


def test_observation_positions_get_no_gradient_in_the_sft_loss(tiny_policy_dir, rows_path, rows, tmp_path):
    config = make_config(tiny_policy_dir, rows_path, tmp_path / "run")
    loaded = load_policy_model(tiny_policy_dir)
    examples, _ = sft_examples(rows[:6], loaded.tokenizer, 0, ["intervention"], 1024)
    trainer = sft_trainer(config, loaded.model, loaded.tokenizer, examples, 1)
    # On the model's device, as the Trainer's own training step puts them (CUDA where there is one).
    inputs = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(len(examples))]))
    captured = []

    def keep(module, args, output):
        output.retain_grad()
        captured.append(output)

    handle = loaded.model.model.norm.register_forward_hook(keep)
    trainer.compute_loss(trainer.model, inputs).backward()
    handle.remove()
    gradient = captured[0].grad.abs().sum(dim=-1)
    # The final hidden state at position t feeds only the prediction of token t + 1.
    predicts_target = torch.zeros_like(inputs["labels"], dtype=torch.bool)
    predicts_target[:, :-1] = inputs["labels"][:, 1:] != -100
    assert (gradient[predicts_target] > 0).all()
    assert (gradient[~predicts_target] == 0).all()
    observation_ids = set(loaded.tokenizer(". # A |", add_special_tokens=False)["input_ids"])
    for labels, ids in zip(inputs["labels"], inputs["input_ids"], strict=True):
        targets = set(ids[labels != -100].tolist())
        assert observation_ids & set(ids.tolist()) and not observation_ids & targets


def _completion_logp(policy: Path, rows: list[dict]) -> float:
    """Mean log-probability of the corrections under the policy in `policy`."""
    loaded = load_policy_model(policy)
    examples, _ = sft_examples(rows, loaded.tokenizer, 0, ["intervention"], 1024)
    turns = []
    for example in examples:
        prompt_length = example["labels"].count(-100)
        turns.append(TurnEncoding(example["input_ids"][:prompt_length], example["input_ids"][prompt_length:]))
    with torch.no_grad():
        batch = pad_turns(turns, loaded.tokenizer.pad_token_id)
        logits = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logps = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return (logps * batch.completion_mask[:, 1:]).sum(-1).mean().item()


def test_sft_makes_the_corrections_more_likely(tiny_policy_dir, rows_path, rows, tmp_path):
    reporter = RecordingReporter()
    summary = main(make_config(tiny_policy_dir, rows_path, tmp_path / "run", max_steps=10, eval_tasks=4), reporter)
    assert _completion_logp(tmp_path / "run", rows) > _completion_logp(tiny_policy_dir, rows) + 2.0
    assert reporter.steps == [(step, 10) for step in range(1, 11)]
    losses = reporter.series("loss")
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert summary["labels_used"] == len(rows) and summary["sources"] == {
        "intervention": len(rows) - 1,
        "demonstration": 1,
    }
    assert summary["metrics"]["final"]["tasks"] == 4 and "greedy_gain" in summary["metrics"]
    manifest = json.loads((tmp_path / "run" / "tandem_artifact.json").read_text())
    assert manifest["kind"] == "sft_policy"


def test_eval_base_off_evaluates_only_the_trained_policy(tiny_policy_dir, rows_path, tmp_path):
    config = make_config(tiny_policy_dir, rows_path, tmp_path / "run", max_steps=2, eval_tasks=3, eval_base=False)
    metrics = main(config)["metrics"]
    assert metrics["base"] == {} and metrics["final"]["tasks"] == 3
    assert "greedy_gain" not in metrics and "sampled_gain" not in metrics


def test_a_cancelled_run_resumes_from_its_checkpoint_and_a_finished_one_returns_its_summary(
    tiny_policy_dir, rows_path, tmp_path
):
    config = make_config(tiny_policy_dir, rows_path, tmp_path / "run", max_steps=5, save_steps=2)
    summary, reporter = resumed_after_cancel(main, config, raise_at=3)
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert [step for step, _ in reporter.steps] == [3, 4, 5]
    assert_finished_returns_summary(main, config, summary)


def test_no_rows_of_the_chosen_sources_is_refused_naming_the_data(tiny_policy_dir, rows_path, tmp_path):
    with pytest.raises(ConfigError) as error:
        main(make_config(tiny_policy_dir, rows_path, tmp_path / "run", sources=["takeover"]))
    assert error.value.field == "data_path" and "takeover" in str(error.value)


@pytest.mark.parametrize(
    ("values", "field"), [({"sources": ["rating"]}, "sources"), ({"num_epochs": 0}, "num_epochs")]
)
def test_a_bad_setting_is_refused_naming_its_field(values, field, tiny_policy_dir, rows_path):
    with pytest.raises(ConfigError) as error:
        config_from_dict(SFTConfig, {"policy_path": str(tiny_policy_dir), "data_path": str(rows_path), **values})
    assert error.value.field == field


def test_the_command_line_shows_help_and_trains(tiny_policy_dir, rows_path, rows, tmp_path):
    shown = command_help("reward_models.finetune.sft")
    assert "--sources" in shown and "--num_epochs" in shown
    flags = {**TINY, "max_steps": 2, "environment_config": json.dumps(SMALL_GRID), "sources": "intervention"}
    flags.update(policy_path=tiny_policy_dir, data_path=rows_path, output_dir=tmp_path / "run")
    summary = run_command("reward_models.finetune.sft", flags)
    assert summary["steps"] == 2 and summary["sources"] == {"intervention": len(rows) - 1}


def test_intervention_sft_rows_are_the_prefix_then_the_same_correction_as_the_step_pairs(episodes):
    from simulation.oracle_data import intervention_step_preference_rows

    pairs = intervention_step_preference_rows(episodes, seed=4)
    rows = intervention_sft_rows(episodes, seed=4)
    assert [row["messages"] for row in rows] == [pair["prompt"] + pair["chosen"] for pair in pairs]
    assert all(row["source"] == "intervention" and row["step_index"] == len(row["messages"]) // 2 - 1 for row in rows)


def test_sft_on_tool_calls_prompts_with_the_tools_and_learns_the_assistant_turns_only(tool_policy_dir, tmp_path):
    conversation = tool_chat.trajectory(3, 3)
    row = {"messages": conversation.messages, "tools": tool_chat.TOOLS, "source": "demonstration", "step_index": None}
    loaded = load_policy_model(tool_policy_dir)
    tokenizer = loaded.tokenizer
    examples, used = sft_examples([row], tokenizer, None, ["demonstration"], 1024)
    assert used == {"demonstration": 1} and len(examples) == conversation.num_steps
    whole = tokenizer.apply_chat_template(conversation.messages, tools=tool_chat.TOOLS, tokenize=False)
    learnt = [tokenizer.decode([t for t in example["labels"] if t != -100]) for example in examples]
    # The assistant's turns, as the template renders them (a tool_calls field and raw markup alike), and nothing
    # else: the tool results and the user's messages are never targets.
    assert learnt == tool_chat.assistant_spans(tokenizer, whole)
    for example in examples:
        prompt = tokenizer.decode(
            [t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label == -100]
        )
        assert prompt.startswith(
            tokenizer.apply_chat_template(conversation.prompt, tools=tool_chat.TOOLS, tokenize=False)
        )
        assert tool_chat.TOOLS_BLOCK in prompt
    data = write_jsonl([row], tmp_path / "sft.jsonl")
    config = make_config(
        tool_policy_dir,
        data,
        tmp_path / "run",
        **tool_chat.RUN_ENVIRONMENT,
        max_steps=2,
        batch_size=2,
    )
    summary = main(config)
    assert summary["steps"] == 2 and summary["turns"] == conversation.num_steps
