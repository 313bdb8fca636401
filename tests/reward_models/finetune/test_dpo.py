"""DPO of a policy: step-level pairs through TRL's DPOTrainer on the policy's own turn encodings, whole-trajectory
pairs through our own loop, per-action balancing, the observation mask, resume and the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from reward_models.common.config import ConfigError, config_from_dict
from reward_models.common.runtime import fresh_accelerator
from reward_models.envs.gridworld import GridWorld
from reward_models.finetune.dpo import DPOConfig, main, row_problems, sequence_logprobs, step_trainer
from reward_models.finetune.dpo_pairs import (
    PreferencePair,
    balance_by_action,
    preference_pairs,
)
from reward_models.finetune.policy_model import load_policy_model
from reward_models.finetune.turn_batches import pad_turns
from reward_models.policy.model import save_policy
from reward_models.policy.turns import format_decision, parse_decision, render_prompt
from simulation.episodes import scripted_episodes
from simulation.oracle_data import intervention_step_preference_rows, preference_rows, write_jsonl
from tests.launch import command_help, flag_arguments, run_launched
from tests.reward_models import tool_chat
from tests.reward_models.finetune.gradients import assert_gradient_on_completions, assert_prompts_show_observations
from tests.reward_models.reporters import RecordingReporter, RunCancelled, assert_finished_returns_summary

SMALL_GRID = {"size": 4, "max_steps": 6}
TINY = {"environment_config": SMALL_GRID, "eval_tasks": 0, "batch_size": 8, "learning_rate": 1e-3, "logging_steps": 1}
GRID = GridWorld(**SMALL_GRID)


@pytest.fixture(scope="module")
def episodes():
    return scripted_episodes(30, per_task=2, noises=(0.5, 0.9), seed=3, env_config=SMALL_GRID)


@pytest.fixture(scope="module")
def step_rows_path(episodes, tmp_path_factory) -> Path:
    return write_jsonl(intervention_step_preference_rows(episodes), tmp_path_factory.mktemp("dpo") / "steps.jsonl")


@pytest.fixture(scope="module")
def one_sided_rows_path(episodes, tmp_path_factory) -> Path:
    """Intervention pairs in which "right" is always chosen over "left": a preference an untrained policy can learn
    in a few steps (and one that per-action balancing removes entirely)."""
    rows = intervention_step_preference_rows(episodes)
    for row in rows:
        reasoning, _ = parse_decision(row["chosen"][0]["content"])
        row["chosen"] = [{"role": "assistant", "content": format_decision(reasoning, "right")}]
        row["rejected"] = [{"role": "assistant", "content": format_decision(reasoning, "left")}]
    return write_jsonl(rows, tmp_path_factory.mktemp("dpo") / "one_sided.jsonl")


@pytest.fixture(scope="module")
def trajectory_rows_path(episodes, tmp_path_factory) -> Path:
    return write_jsonl(preference_rows(episodes), tmp_path_factory.mktemp("dpo") / "pairs.jsonl")


@pytest.fixture(scope="module")
def windowed_policy(tiny_policy_dir, tmp_path_factory) -> Path:
    """The tiny policy, but shown one previous turn: its prompts hold history."""
    loaded = load_policy_model(tiny_policy_dir)
    return save_policy(
        loaded.model, loaded.tokenizer, tmp_path_factory.mktemp("windowed"), history_window=1, max_new_tokens=12
    )


def make_config(policy: Path, data: Path, output_dir: Path, **overrides) -> DPOConfig:
    values = {**TINY, "policy_path": str(policy), "data_path": str(data), "output_dir": str(output_dir), **overrides}
    return config_from_dict(DPOConfig, values)


def tool_config(policy: Path, data: Path, output_dir: Path, **overrides) -> DPOConfig:
    """A two-step run in batches of two on the tool-calling test environment (`tool_chat.ToolCounter`)."""
    return make_config(policy, data, output_dir, **tool_chat.RUN_ENVIRONMENT, max_steps=2, batch_size=2, **overrides)


def chosen_margins(policy: Path, pairs: list[PreferencePair]) -> torch.Tensor:
    """log p(chosen) - log p(rejected) of each pair under the policy in `policy`."""
    loaded = load_policy_model(policy)
    with torch.no_grad():
        chosen, _, rejected = sequence_logprobs(loaded.model, pairs, loaded.tokenizer.pad_token_id, 1024)
    return chosen - rejected


def margins_before_and_after(
    policy: Path, run: Path, rows_path: Path, level: str
) -> tuple[list[dict], list[PreferencePair], torch.Tensor, torch.Tensor]:
    """The rows of `rows_path`, their pairs at `level`, and the pairs' `chosen_margins` under the policy in `policy`
    and under the one the run in `run` trained from it."""
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    pairs = preference_pairs(rows, load_policy_model(policy).tokenizer, 0, level, GRID)
    return rows, pairs, chosen_margins(policy, pairs), chosen_margins(run, pairs)


def test_a_step_pair_is_the_prompt_the_policy_saw_and_the_step_it_writes(windowed_policy, episodes):
    rows = [row for row in intervention_step_preference_rows(episodes) if row["step_index"] >= 1]
    row = rows[0]
    loaded = load_policy_model(windowed_policy)
    tokenizer = loaded.tokenizer
    [pair] = preference_pairs([row], tokenizer, history_window=1, level="step", env=GRID)
    # What LocalCausalLMPolicy tokenizes before generating this turn: the instruction, the previous observation and
    # turn, then the observation the step acted on.
    messages = [row["prompt"][0], *row["prompt"][-3:]]
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "user"]
    prompt_ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    assert [turn.prompt_ids for turn in (*pair.chosen, *pair.rejected)] == [prompt_ids, prompt_ids]
    for side, turn in (("chosen", pair.chosen[0]), ("rejected", pair.rejected[0])):
        text = row[side][0]["content"]
        assert turn.completion_ids == tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert (pair.chosen_action, pair.rejected_action) == (row["chosen_action"], row["rejected_action"])


def test_step_dpo_on_tool_calls_prompts_with_the_tools_and_trains_the_assistant_turn_only(tool_policy_dir, tmp_path):
    rows = tool_chat.step_preference_rows()
    data = write_jsonl(rows, tmp_path / "steps.jsonl")
    # The corrections raise the quantity one by one, a chain with no cycle: balancing would keep none of them.
    config = tool_config(tool_policy_dir, data, tmp_path / "run", balance="none")
    loaded = load_policy_model(tool_policy_dir)
    tokenizer = loaded.tokenizer
    pairs = preference_pairs(rows, tokenizer, None, "step", GridWorld())
    trainer = step_trainer(config, loaded.model, tokenizer, pairs, steps=1)
    for row, record in zip(rows, trainer.train_dataset, strict=True):
        prompt = tokenizer.decode(record["prompt_ids"])
        assert tool_chat.TOOLS_BLOCK in prompt and "<tool_response>" in prompt
        assert prompt == tokenizer.apply_chat_template(
            row["prompt"], tools=tool_chat.TOOLS, tokenize=False, add_generation_prompt=True
        )
        for side in ("chosen", "rejected"):
            whole = tokenizer.apply_chat_template(row["prompt"] + row[side], tools=tool_chat.TOOLS, tokenize=False)
            assert tokenizer.decode(record[f"{side}_ids"]) == tool_chat.assistant_spans(tokenizer, whole)[-1]
    summary = main(config, RecordingReporter())
    assert summary["steps"] == 2 and summary["metrics"]["used"] == len(rows)


def test_trajectory_dpo_on_tool_calls_scores_every_assistant_turn_and_no_tool_result(tool_policy_dir, tmp_path):
    rows = tool_chat.preference_rows(4)
    data = write_jsonl(rows, tmp_path / "pairs.jsonl")
    loaded = load_policy_model(tool_policy_dir)
    tokenizer = loaded.tokenizer
    [pair, *_] = preference_pairs(rows, tokenizer, None, "trajectory", GridWorld())
    whole = tokenizer.apply_chat_template(rows[0]["prompt"] + rows[0]["chosen"], tools=tool_chat.TOOLS, tokenize=False)
    batch = pad_turns(pair.chosen, tokenizer.pad_token_id)
    trained = [
        tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(batch.input_ids, batch.completion_mask, strict=True)
    ]
    assert trained == tool_chat.assistant_spans(tokenizer, whole)
    assert all(tool_chat.TOOLS_BLOCK in tokenizer.decode(turn.prompt_ids) for turn in pair.chosen)
    config = tool_config(tool_policy_dir, data, tmp_path / "run", level="trajectory")
    assert main(config, RecordingReporter())["steps"] == 2


def test_observation_positions_get_no_gradient_in_the_step_level_dpo_loss(tiny_policy_dir, step_rows_path, tmp_path):
    config = make_config(tiny_policy_dir, step_rows_path, tmp_path / "run", precompute_ref_log_probs=False)
    loaded = load_policy_model(tiny_policy_dir)
    rows = [json.loads(line) for line in step_rows_path.read_text().splitlines()][:4]
    pairs = preference_pairs(rows, loaded.tokenizer, 0, "step", GRID)
    trainer = step_trainer(config, loaded.model, loaded.tokenizer, pairs, steps=1)
    # On the model's device, as the Trainer's own training step puts them (CUDA where there is one).
    inputs = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))]))
    # The final hidden state at position t feeds only the prediction of token t + 1.
    captured = {}

    def keep(module, args, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = loaded.model.model.norm.register_forward_hook(keep)
    trainer.compute_loss(trainer.model, inputs).backward()
    handle.remove()
    mask = inputs["completion_mask"]
    assert_gradient_on_completions(captured["hidden"].grad.abs().sum(dim=-1), mask)
    # Rows are [chosen..., rejected...]; the completion is exactly each side's step, the rest is the prompt.
    prompts = [pair.chosen[0].prompt_ids for pair in [*pairs, *pairs]]
    assert_prompts_show_observations(loaded.tokenizer, inputs["input_ids"], prompts)
    assert mask.sum().item() == sum(len(p.chosen[0].completion_ids) + len(p.rejected[0].completion_ids) for p in pairs)


def test_step_level_dpo_raises_the_chosen_steps_over_the_rejected_ones(tiny_policy_dir, one_sided_rows_path, tmp_path):
    reporter = RecordingReporter()
    config = make_config(
        tiny_policy_dir, one_sided_rows_path, tmp_path / "run", max_steps=12, eval_tasks=4, balance="none"
    )
    summary = main(config, reporter)
    rows, pairs, before, after = margins_before_and_after(
        tiny_policy_dir, tmp_path / "run", one_sided_rows_path, "step"
    )
    assert after.mean() > before.mean() + 1.0
    assert (after > before).float().mean() > 0.8
    assert reporter.steps == [(step, 12) for step in range(1, 13)]
    losses = reporter.series("loss")
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert summary["labels_used"] == summary["pairs_available"] == len(rows)
    metrics = summary["metrics"]
    assert (metrics["used"], metrics["ties"], metrics["unbalanced"]) == (
        len(rows),
        0,
        0,
    )
    assert summary["action_counts"] == {
        "left": {"chosen": 0, "rejected": len(rows)},
        "right": {"chosen": len(rows), "rejected": 0},
    }
    assert balance_by_action(pairs, 0) == []
    assert set(summary["metrics"]["base"]) >= {"greedy_success", "greedy_stderr", "sampled_success", "sampled_stderr"}
    assert summary["metrics"]["final"]["tasks"] == 4
    # Each task's success is kept, so the gains carry their paired standard errors.
    assert (
        len(summary["metrics"]["base"]["sampled_per_task"])
        == len(summary["metrics"]["final"]["sampled_per_task"])
        == 4
    )
    assert summary["metrics"]["sampled_gain_stderr"] >= 0 and summary["metrics"]["greedy_gain_stderr"] >= 0
    manifest = json.loads((tmp_path / "run" / "tandem_artifact.json").read_text())
    assert manifest["kind"] == "dpo_policy" and manifest["summary"] == json.loads(json.dumps(summary))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_trajectory_dpo_sums_the_turns_of_each_side(tiny_policy_dir, trajectory_rows_path):
    loaded = load_policy_model(tiny_policy_dir)
    rows = [json.loads(line) for line in trajectory_rows_path.read_text().splitlines()][:3]
    pairs = preference_pairs(rows, loaded.tokenizer, 0, "trajectory", GRID)
    for row, pair in zip(rows, pairs, strict=True):
        assert len(pair.chosen) == sum(message["role"] == "assistant" for message in row["chosen"])
        assert len(pair.rejected) == sum(message["role"] == "assistant" for message in row["rejected"])
    with torch.no_grad():
        chosen, tokens, rejected = sequence_logprobs(loaded.model, pairs, loaded.tokenizer.pad_token_id, 1024)
        for side, sums in (("chosen", chosen), ("rejected", rejected)):
            for pair, total in zip(pairs, sums, strict=True):
                turns = getattr(pair, side)
                batch = pad_turns(turns, loaded.tokenizer.pad_token_id)
                logits = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                logps = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
                assert total.item() == pytest.approx((logps * batch.completion_mask[:, 1:]).sum().item(), abs=1e-3)
    assert tokens.item() == sum(len(turn.completion_ids) for pair in pairs for turn in pair.chosen)


def test_observation_positions_get_no_gradient_in_the_trajectory_loss(tiny_policy_dir, trajectory_rows_path):
    loaded = load_policy_model(tiny_policy_dir)
    rows = [json.loads(line) for line in trajectory_rows_path.read_text().splitlines()][:3]
    pairs = preference_pairs(rows, loaded.tokenizer, 0, "trajectory", GRID)
    captured = []

    def keep(module, args, output):
        output.retain_grad()
        captured.append(output)

    handle = loaded.model.model.norm.register_forward_hook(keep)
    chosen, _, rejected = sequence_logprobs(loaded.model, pairs, loaded.tokenizer.pad_token_id, 1024)
    torch.nn.functional.logsigmoid(chosen - rejected).sum().backward()
    handle.remove()
    turns = [turn for pair in pairs for turn in pair.chosen] + [turn for pair in pairs for turn in pair.rejected]
    batch = pad_turns(turns, loaded.tokenizer.pad_token_id)
    assert_gradient_on_completions(captured[0].grad.abs().sum(dim=-1), batch.completion_mask)


def test_trajectory_dpo_raises_the_preferred_trajectories(tiny_policy_dir, trajectory_rows_path, tmp_path):
    reporter = RecordingReporter()
    config = make_config(
        tiny_policy_dir,
        trajectory_rows_path,
        tmp_path / "run",
        level="trajectory",
        balance="none",
        max_steps=10,
        num_epochs=10,
    )
    summary = main(config, reporter)
    rows, _, before, after = margins_before_and_after(
        tiny_policy_dir, tmp_path / "run", trajectory_rows_path, "trajectory"
    )
    assert after.mean() > before.mean() + 1.0
    assert reporter.steps == [(step, 10) for step in range(1, 11)]
    accuracies = reporter.series("rewards_accuracies")
    assert accuracies[-1] > accuracies[0]
    assert summary["labels_used"] == len(rows) and summary["steps"] == 10


def test_trajectory_dpo_scores_the_reference_under_the_policys_bf16_autocast(
    tiny_policy_dir, trajectory_rows_path, tmp_path, monkeypatch
):
    """With the starting policy as the reference, each side's reference log-probability is exactly the policy's at the
    first step, in bf16 as in fp32: every implicit reward starts at 0 and the DPO loss at log 2."""
    from reward_models.finetune import dpo

    # The config offers bf16 only with CUDA; accelerate's bf16 autocast runs on a CPU all the same.
    monkeypatch.setattr(dpo, "make_accelerator", lambda config: fresh_accelerator("bf16"))
    reporter = RecordingReporter()
    config = make_config(
        tiny_policy_dir, trajectory_rows_path, tmp_path / "run", level="trajectory", balance="none", max_steps=1
    )
    main(config, reporter)
    [first] = reporter.metrics
    assert first["rewards_margins"] == 0.0 and first["rewards_accuracies"] == 0.0
    assert first["dpo_loss"] == pytest.approx(math.log(2), abs=1e-7)


@pytest.mark.parametrize("level", ["step", "trajectory"])
def test_a_cancelled_run_resumes_from_its_checkpoint_and_a_finished_one_returns_its_summary(
    level, tiny_policy_dir, step_rows_path, trajectory_rows_path, tmp_path
):
    data = step_rows_path if level == "step" else trajectory_rows_path
    config = make_config(tiny_policy_dir, data, tmp_path / "run", level=level, max_steps=5, save_steps=2)
    with pytest.raises(RunCancelled):
        main(config, RecordingReporter(raise_at=3))
    assert not (tmp_path / "run" / "tandem_artifact.json").exists()
    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert summary["resumed_from"] and summary["resumed_from"].rstrip("/").endswith("2")
    assert [step for step, _ in reporter.steps] == [3, 4, 5]
    assert summary["steps"] == 5 and not (tmp_path / "run" / "checkpoints").exists()

    again = assert_finished_returns_summary(main, config, summary)
    assert any("already holds" in line for line in again.lines)


def test_rows_that_are_not_conversational_pairs_are_refused_naming_the_data(tiny_policy_dir, tmp_path, episodes):
    text_rows = preference_rows(episodes[:4], style="text")
    data = write_jsonl(text_rows, tmp_path / "text.jsonl")
    with pytest.raises(ConfigError) as error:
        main(make_config(tiny_policy_dir, data, tmp_path / "run", level="trajectory"))
    assert error.value.field == "data_path" and "rows 1, 2:" in str(error.value)
    assert "conversational" in str(error.value)


def test_the_row_check_names_every_row_that_is_no_pair_and_why(episodes, tiny_policy_dir):
    rows = preference_rows(episodes)[:8]
    assert len(rows) == 8
    rows[2]["prompt"] = rows[2]["prompt"][:1]  # the instruction alone: two sides that start apart
    rows[5]["chosen"] = "left"
    rows[6]["tie"] = True  # a tie is no problem: it is left out
    rows[6]["chosen"] = "whatever"
    config = config_from_dict(DPOConfig, {**TINY, "policy_path": str(tiny_policy_dir), "data_path": "x"})
    config.level = "trajectory"
    problems = row_problems(rows, config)
    assert set(problems) == {3, 6}
    assert problems[3].startswith("the prompt must end with an observation (a user or tool message)")
    assert "'chosen' must be a non-empty list of messages" in problems[6]
    loaded = load_policy_model(tiny_policy_dir)
    with pytest.raises(ConfigError) as error:  # loading the data runs the same check
        preference_pairs(rows, loaded.tokenizer, 0, "trajectory", GRID)
    assert str(error.value).startswith("data_path: 2 of 8 rows cannot be used: row 3: the prompt must end")


@pytest.mark.parametrize(
    ("values", "field"),
    [({"level": "episode"}, "level"), ({"beta": 0}, "beta"), ({"balance": "task"}, "balance"), ({}, "data_path")],
)
def test_a_bad_setting_is_refused_naming_its_field(values, field, tiny_policy_dir, step_rows_path):
    data = {"data_path": str(step_rows_path)} if field != "data_path" else {}
    with pytest.raises(ConfigError) as error:
        config_from_dict(DPOConfig, {"policy_path": str(tiny_policy_dir), **data, **values})
    assert error.value.field == field


def test_the_command_line_shows_help_and_trains_across_two_processes(tiny_policy_dir, step_rows_path, tmp_path):
    shown = command_help("reward_models.finetune.dpo")
    assert "--level" in shown and "--sft_weight" in shown and "--balance" in shown
    flags = {**TINY, "max_steps": 2, "environment_config": json.dumps(SMALL_GRID), "precompute_ref_log_probs": True}
    flags.update(policy_path=tiny_policy_dir, data_path=step_rows_path, output_dir=tmp_path / "run")
    # Two processes: TRL's precomputed reference log-probs must reach the second one (they are cached beside the
    # dataset's files), and only the first prints the summary.
    summary = json.loads(run_launched("reward_models.finetune.dpo", flag_arguments(flags)).stdout)
    assert summary["steps"] == 2 and (tmp_path / "run" / "model.safetensors").is_file()


def test_oracle_interventions_on_the_policys_own_rollouts_correct_its_first_wrong_step(tiny_policy_dir):
    from reward_models.envs.gridworld import GridWorld
    from reward_models.policy.local import LocalCausalLMPolicy
    from simulation.episodes import policy_episodes

    policy = LocalCausalLMPolicy(tiny_policy_dir)
    episodes = policy_episodes(policy, 6, samples_per_task=2, seed=1, env_config=SMALL_GRID)
    assert len(episodes) == 12 and all(episode.task_id not in GridWorld().eval_seeds() for episode in episodes)
    rows = intervention_step_preference_rows(episodes, seed=0)
    wrong = [episode for episode in episodes if episode.first_error is not None]
    assert len(rows) == len(wrong) > 0
    for row, episode in zip(rows, wrong, strict=True):
        step = episode.first_error
        assert row["step_index"] == step and row["prompt"] == episode.conversation.before_step(step)
        # The rejected step is what the policy wrote there; the chosen one a shortest-path move from that state.
        assert row["rejected"] == [episode.conversation.assistant(step)]
        env = GridWorld(**SMALL_GRID)
        best = env.oracle(env.make_task(episode.task_id)).best_actions(episode.actions[:step])
        assert parse_decision(row["chosen"][0]["content"])[1] == row["chosen_action"] in best
