"""KTO of a policy from unpaired ratings, turn by turn through TRL's KTOTrainer: each assistant turn with its own
prompt and the trajectory's label, the KL completions, the observation mask, resume and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune.kto import KTOConfig, kto_examples, kto_trainer, main, with_kl_completions
from reward_models.finetune.policy_model import load_policy_model
from reward_models.finetune.turn_batches import pad_turns, row_conversation
from reward_models.policy.turns import TurnEncoding, format_decision, parse_decision, render_prompt
from simulation.episodes import scripted_episodes
from simulation.oracle_data import unpaired_rows, write_jsonl
from tests.launch import command_help, run_command
from tests.reward_models import tool_chat
from tests.reward_models.finetune.gradients import assert_gradient_on_completions, assert_prompts_show_observations
from tests.reward_models.reporters import RecordingReporter, assert_finished_returns_summary, resumed_after_cancel

SMALL_GRID = {"size": 4, "max_steps": 6}
TINY = {"environment_config": SMALL_GRID, "eval_tasks": 0, "batch_size": 8, "learning_rate": 1e-3, "logging_steps": 1}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return unpaired_rows(scripted_episodes(24, per_task=2, noises=(0.1, 0.9), seed=5, env_config=SMALL_GRID))


@pytest.fixture(scope="module")
def rows_path(rows, tmp_path_factory) -> Path:
    return write_jsonl(rows, tmp_path_factory.mktemp("kto") / "unpaired.jsonl")


@pytest.fixture(scope="module")
def one_sided_path(rows, tmp_path_factory) -> Path:
    """Every desirable trajectory only ever moves right and every undesirable one left: a rating signal an untrained
    policy can pick up in a few steps."""
    rewritten = []
    for row in rows:
        action = "right" if row["label"] else "left"
        completion = [
            {**message, "content": format_decision(parse_decision(message["content"])[0], action)}
            if message["role"] == "assistant"
            else message
            for message in row["completion"]
        ]
        rewritten.append({**row, "completion": completion})
    return write_jsonl(rewritten, tmp_path_factory.mktemp("kto") / "one_sided.jsonl")


def make_config(policy: Path, data: Path, output_dir: Path, **overrides) -> KTOConfig:
    values = {**TINY, "policy_path": str(policy), "data_path": str(data), "output_dir": str(output_dir), **overrides}
    return config_from_dict(KTOConfig, values)


def test_every_assistant_turn_is_an_example_with_its_own_prompt_and_the_trajectorys_label(tiny_policy_dir, rows):
    loaded = load_policy_model(tiny_policy_dir)
    tokenizer = loaded.tokenizer
    examples, used = kto_examples(rows[:3], tokenizer, history_window=0, max_length=1024)
    assert used == 3
    expected = []
    for row in rows[:3]:
        conversation = row_conversation(row["prompt"] + row["completion"])
        for step in range(conversation.num_steps):
            # What the policy tokenizes before generating this turn (window 0: the instruction and the observation).
            shown = [conversation.messages[0], conversation.messages[conversation.step_starts[step] - 1]]
            prompt = render_prompt(tokenizer, shown)
            text = conversation.assistant(step)["content"]
            completion = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            expected.append((tokenizer(prompt, add_special_tokens=False)["input_ids"], completion, row["label"]))
    assert [(e["prompt_ids"], e["completion_ids"], e["label"]) for e in examples] == expected


def test_kl_completions_are_the_completions_rotated_within_each_batch():
    examples = [{"prompt_ids": [n], "completion_ids": [10 + n], "label": True} for n in range(5)]
    rotated = with_kl_completions(examples, batch_size=2)
    assert [e["KL_completion_ids"] for e in rotated] == [[11], [10], [13], [12], [14]]
    assert [e["completion_ids"] for e in rotated] == [e["completion_ids"] for e in examples]


def test_observation_positions_get_no_gradient_in_the_kto_loss(tiny_policy_dir, rows_path, rows, tmp_path):
    config = make_config(tiny_policy_dir, rows_path, tmp_path / "run", precompute_ref_log_probs=False)
    loaded = load_policy_model(tiny_policy_dir)
    examples, _ = kto_examples(rows[:4], loaded.tokenizer, 0, 1024)
    examples = [e for e in examples if e["label"]][:4] + [e for e in examples if not e["label"]][:4]
    weights = {"desirable_weight": 1.0, "undesirable_weight": 1.0}
    trainer = kto_trainer(config, loaded.model, loaded.tokenizer, examples, 1, weights)
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(examples))])
    captured = []

    def keep(module, args, output):
        if output.requires_grad:  # the KL forward runs without gradient
            output.retain_grad()
            captured.append(output)

    handle = loaded.model.model.norm.register_forward_hook(keep)
    trainer.compute_loss(trainer.model, inputs).backward()
    handle.remove()
    [hidden] = captured
    assert_gradient_on_completions(hidden.grad.abs().sum(dim=-1), inputs["completion_mask"])
    prompts = [example["prompt_ids"] for example in examples]
    assert_prompts_show_observations(loaded.tokenizer, inputs["input_ids"], prompts)


def _turn_logps(policy: Path, data: Path, label: bool) -> float:
    """Mean log-probability of the turns of the rows with `label` under the policy in `policy`."""
    loaded = load_policy_model(policy)
    examples, _ = kto_examples([json.loads(line) for line in data.read_text().splitlines()], loaded.tokenizer, 0, 1024)
    turns = [TurnEncoding(e["prompt_ids"], e["completion_ids"]) for e in examples if e["label"] == label]
    with torch.no_grad():
        batch = pad_turns(turns, loaded.tokenizer.pad_token_id)
        logits = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logps = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return (logps * batch.completion_mask[:, 1:]).sum(-1).mean().item()


def test_kto_raises_desirable_turns_and_lowers_undesirable_ones(tiny_policy_dir, one_sided_path, tmp_path):
    reporter = RecordingReporter()
    summary = main(make_config(tiny_policy_dir, one_sided_path, tmp_path / "run", max_steps=12), reporter)
    gap_before = _turn_logps(tiny_policy_dir, one_sided_path, True) - _turn_logps(
        tiny_policy_dir, one_sided_path, False
    )
    gap_after = _turn_logps(tmp_path / "run", one_sided_path, True) - _turn_logps(
        tmp_path / "run", one_sided_path, False
    )
    assert gap_after > gap_before + 1.0
    assert reporter.steps == [(step, 12) for step in range(1, 13)]
    losses = reporter.series("loss")
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3])
    assert summary["desirable_turns"] + summary["undesirable_turns"] == summary["turns"]
    assert summary["labels_used"] == len(one_sided_path.read_text().splitlines())
    manifest = json.loads((tmp_path / "run" / "tandem_artifact.json").read_text())
    assert manifest["kind"] == "kto_policy"


def test_a_cancelled_run_resumes_from_its_checkpoint_and_a_finished_one_returns_its_summary(
    tiny_policy_dir, rows_path, tmp_path
):
    config = make_config(
        tiny_policy_dir, rows_path, tmp_path / "run", max_steps=5, save_steps=2, precompute_ref_log_probs=True
    )
    summary, reporter = resumed_after_cancel(main, config, raise_at=3)
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert [step for step, _ in reporter.steps] == [3, 4, 5]
    assert_finished_returns_summary(main, config, summary)


def test_ratings_of_one_kind_only_are_refused_naming_the_data(tiny_policy_dir, rows, tmp_path):
    data = write_jsonl([row for row in rows if row["label"]], tmp_path / "up.jsonl")
    with pytest.raises(ConfigError) as error:
        main(make_config(tiny_policy_dir, data, tmp_path / "run"))
    assert error.value.field == "data_path" and "undesirable" in str(error.value)


@pytest.mark.parametrize(("values", "field"), [({"batch_size": 1}, "batch_size"), ({"beta": 0}, "beta")])
def test_a_bad_setting_is_refused_naming_its_field(values, field, tiny_policy_dir, rows_path):
    with pytest.raises(ConfigError) as error:
        config_from_dict(KTOConfig, {"policy_path": str(tiny_policy_dir), "data_path": str(rows_path), **values})
    assert error.value.field == field


def test_the_command_line_shows_help_and_trains(tiny_policy_dir, rows_path, tmp_path):
    shown = command_help("reward_models.finetune.kto")
    assert "--beta" in shown and "--balance_weights" in shown
    flags = {**TINY, "max_steps": 2, "environment_config": json.dumps(SMALL_GRID)}
    flags.update(policy_path=tiny_policy_dir, data_path=rows_path, output_dir=tmp_path / "run")
    summary = run_command("reward_models.finetune.kto", flags)
    assert summary["steps"] == 2 and (tmp_path / "run" / "model.safetensors").is_file()


def test_unpaired_rows_rate_successes_up_and_failures_down():
    episodes = scripted_episodes(12, per_task=2, noises=(0.1, 0.9), seed=5, env_config=SMALL_GRID)
    rows = unpaired_rows(episodes)
    assert [row["label"] for row in rows] == [episode.success for episode in episodes]
    assert [row["prompt"] + row["completion"] for row in rows] == [episode.messages for episode in episodes]
    flipped = unpaired_rows(episodes, epsilon=1.0)
    assert [row["label"] for row in flipped] == [not episode.success for episode in episodes]


def test_kto_on_tool_calls_prompts_with_the_tools_and_rates_the_assistant_turns_only(tool_policy_dir, tmp_path):
    rows = []
    for index, row in enumerate(tool_chat.preference_rows(4)):
        base = {"prompt": row["prompt"], "tools": row["tools"], "task_id": index}
        rows += [
            {**base, "completion": row["chosen"], "label": True},
            {**base, "completion": row["rejected"], "label": False},
        ]
    tokenizer = load_policy_model(tool_policy_dir).tokenizer
    examples, used = kto_examples(rows, tokenizer, None, 1024)
    assert used == len(rows) and len(examples) == 3 * len(rows)
    whole = tokenizer.apply_chat_template(
        rows[0]["prompt"] + rows[0]["completion"], tools=tool_chat.TOOLS, tokenize=False
    )
    assert [tokenizer.decode(e["completion_ids"]) for e in examples[:3]] == tool_chat.assistant_spans(tokenizer, whole)
    assert all(tool_chat.TOOLS_BLOCK in tokenizer.decode(e["prompt_ids"]) for e in examples)
    assert all("<tool_response>" not in tokenizer.decode(e["completion_ids"]) for e in examples)
    data = write_jsonl(rows, tmp_path / "unpaired.jsonl")
    config = make_config(
        tool_policy_dir,
        data,
        tmp_path / "run",
        **tool_chat.RUN_ENVIRONMENT,
        max_steps=2,
        batch_size=4,
    )
    assert main(config)["steps"] == 2
