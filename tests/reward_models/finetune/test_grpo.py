"""GRPO and RLOO through TRL on a single-turn gridworld task (the first decision of a task), with a reward model
trained on oracle-labelled single-step comparisons as the reward function."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from reward_models.common.artifacts import read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.envs.gridworld import GridWorld
from reward_models.finetune.grpo import (
    GRPOConfig,
    RewardModelReward,
    data_prompts,
    environment_prompts,
    first_step_preference_rows,
    main,
    prompt_dataset,
)
from reward_models.policy.turns import parse_decision
from simulation.oracle_data import write_jsonl
from tests.launch import command_help, run_command
from tests.reward_models import tool_chat
from tests.reward_models.finetune.judges import trained_judge
from tests.reward_models.reporters import RecordingReporter, assert_finished_returns_summary, resumed_after_cancel

TINY = {
    "prompts_per_step": 2,
    "num_generations": 4,
    "eval_tasks": 4,
    "learning_rate": 1e-3,
    "save_steps": 1000,
    "train_prompts": 16,
}


@pytest.fixture(scope="module")
def reward_model_dir(tiny_base_model, tmp_path_factory) -> Path:
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.train import main as train_reward

    rows = first_step_preference_rows(40)
    work = tmp_path_factory.mktemp("grpo-rm")
    settings = {"max_steps": 10, "batch_size": 8, "learning_rate": 5e-3, "save_steps": 1000}
    return trained_judge(train_reward, RewardConfig, rows, work, "rm", tiny_base_model, **settings)


def make_config(policy_dir, reward_model_dir, output_dir, **overrides) -> GRPOConfig:
    return GRPOConfig(
        policy_path=str(policy_dir),
        reward_model_path=str(reward_model_dir),
        output_dir=str(output_dir),
        **{**TINY, **overrides},
    )


def test_first_step_rows_prefer_an_optimal_move_to_a_wasted_one():
    env = GridWorld()
    rows = first_step_preference_rows(10)
    assert len(rows) == 20
    for row in rows:
        oracle = env.oracle(env.make_task(row["task_id"]))
        assert row["prompt"][1]["content"] == env.reset(env.make_task(row["task_id"]))
        assert parse_decision(row["chosen"][0]["content"])[1] in oracle.best_actions([])
        assert parse_decision(row["rejected"][0]["content"])[1] not in oracle.best_actions([])
        assert row["task_id"] not in env.eval_seeds()
    malformed = first_step_preference_rows(10, pairs_per_task=0, malformed_per_task=1)
    assert len(malformed) == 10
    for row in malformed:
        assert parse_decision(row["chosen"][0]["content"])[1] in env.legal_actions()
        assert parse_decision(row["rejected"][0]["content"])[1] not in env.legal_actions()


def test_the_reward_function_scores_prompt_and_completion_with_the_reward_model(reward_model_dir):
    from reward_models.reward.model import load_reward_model

    rows = first_step_preference_rows(3, pairs_per_task=1, seed=1)
    prompts = [row["prompt"] for row in rows] * 2
    completions = [row["chosen"] for row in rows] + [row["rejected"] for row in rows]
    reward = RewardModelReward(reward_model_dir, "cpu")
    # TRL hands the reward function the sampled texts and the dataset's other columns.
    scores = reward(
        prompts=["rendered"] * len(prompts),
        completions=[completion[0]["content"] for completion in completions],
        completion_ids=None,
        conversation=[json.dumps(prompt) for prompt in prompts],
        tools=["[]"] * len(prompts),
    )
    expected, _ = load_reward_model(reward_model_dir, "cpu").score(prompts, completions)
    assert scores == pytest.approx(expected)
    assert all(math.isfinite(score) for score in scores)


def test_prompts_are_first_observations_of_training_tasks_or_a_snapshots_distinct_prompts(policy_dir, tmp_path):
    config = GRPOConfig(policy_path=str(policy_dir), reward_model_path="rm", output_dir=str(tmp_path))
    env = GridWorld()
    tasks = [env.make_task(seed) for seed in (3, 4)]
    prompts = environment_prompts(config, tasks)
    assert [messages[1]["content"] for messages, _ in prompts] == [env.reset(task) for task in tasks]
    assert [tools for _, tools in prompts] == [None, None]
    rows = [{"prompt": prompts[0][0], "tools": []}, {"prompt": prompts[1][0]}, {"prompt": prompts[0][0]}]
    assert data_prompts(rows) == prompts
    tool_rows = [{"prompt": prompts[0][0], "tools": json.dumps(tool_chat.TOOLS)}]  # as Parquet holds them
    assert data_prompts(rows + tool_rows) == [*prompts, (prompts[0][0], tool_chat.TOOLS)]
    with pytest.raises(ConfigError, match="row 1: 'prompt' must be a non-empty list of messages"):
        data_prompts([{"chosen": []}])


def test_grpo_prompts_reach_trl_rendered_with_their_own_tools(tool_policy_dir, tmp_path):
    from reward_models.finetune.policy_model import load_policy_model
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.train import main as train_reward

    tokenizer = load_policy_model(tool_policy_dir).tokenizer
    rows = tool_chat.step_preference_rows(2)
    prompts = data_prompts(rows + [{"prompt": rows[0]["prompt"]}])
    dataset = prompt_dataset(tokenizer, prompts)
    assert tool_chat.TOOLS_BLOCK in dataset[0]["prompt"] and tool_chat.TOOLS_BLOCK not in dataset[2]["prompt"]
    assert dataset[0]["prompt"] == tokenizer.apply_chat_template(
        rows[0]["prompt"], tools=tool_chat.TOOLS, tokenize=False, add_generation_prompt=True
    )
    rm = tmp_path / "rm"
    data = write_jsonl(tool_chat.step_preference_rows(), tmp_path / "steps.jsonl")
    train_reward(RewardConfig(data_path=str(data), base_model=str(tool_policy_dir), output_dir=str(rm), max_steps=2))
    config = make_config(
        tool_policy_dir,
        rm,
        tmp_path / "run",
        data_path=str(data),
        **tool_chat.RUN_ENVIRONMENT,
        max_steps=1,
        eval_tasks=2,
    )
    summary = main(config, RecordingReporter())
    assert summary["steps"] == 1 and math.isfinite(summary["metrics"]["last_reward"])


@pytest.fixture(scope="module")
def grpo_run(policy_dir, reward_model_dir, tmp_path_factory):
    reporter = RecordingReporter()
    config = make_config(policy_dir, reward_model_dir, tmp_path_factory.mktemp("grpo") / "run", max_steps=4)
    return config, main(config, reporter), reporter


def test_grpo_trains_the_policy_on_reward_model_scores(grpo_run, policy_dir, reward_model_dir):
    from safetensors.torch import load_file

    config, summary, reporter = grpo_run
    assert [current for current, _ in reporter.steps] == [1, 2, 3, 4]
    rewards = reporter.series("reward")
    assert len(rewards) == 4 and all(math.isfinite(value) for value in rewards)
    losses = reporter.series("loss")
    assert len(losses) == 4 and all(math.isfinite(value) for value in losses) and len(set(losses)) > 1
    before = load_file(Path(policy_dir) / "model.safetensors")
    after = load_file(Path(config.output_dir) / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)
    metrics = summary["metrics"]
    for side in ("base", "final"):
        assert {"greedy_success", "sampled_success", "greedy_first_step_accuracy"} <= set(metrics[side])
        assert 0.0 <= metrics[side]["greedy_first_step_accuracy"] <= 1.0
    assert summary["labels_used"] == read_manifest(reward_model_dir)["summary"]["train_samples"] == 80
    assert read_manifest(config.output_dir)["kind"] == "policy"


def test_rloo_runs_through_trls_rloo_trainer(policy_dir, reward_model_dir, tmp_path):
    reporter = RecordingReporter()
    summary = main(
        make_config(policy_dir, reward_model_dir, tmp_path / "rloo", algorithm="rloo", max_steps=2), reporter
    )
    assert summary["algorithm"] == "rloo" and summary["steps"] == 2
    assert [current for current, _ in reporter.steps] == [1, 2]


def test_a_cancelled_run_resumes_from_trls_checkpoint(policy_dir, reward_model_dir, tmp_path):
    config = make_config(policy_dir, reward_model_dir, tmp_path / "run", max_steps=3, save_steps=1, eval_tasks=2)
    summary, _ = resumed_after_cancel(main, config, raise_at=2)
    assert summary["resumed_from"].endswith("checkpoint-1")
    assert summary["steps"] == 3 and summary["steps_this_run"] == 2
    assert_finished_returns_summary(main, config, summary)


def test_bad_settings_name_the_field(policy_dir, tmp_path):
    base = {"policy_path": str(policy_dir), "reward_model_path": "rm", "output_dir": str(tmp_path)}
    for field_name, value in (("algorithm", "ppo"), ("num_generations", 1), ("batch_size", 5), ("kl_beta", -0.1)):
        with pytest.raises(ConfigError) as error:
            config_from_dict(GRPOConfig, {**base, field_name: value})
        assert error.value.field == field_name


def test_command_line_help_and_a_tiny_run(policy_dir, reward_model_dir, tmp_path):
    help_text = command_help("reward_models.finetune.grpo")
    assert "--num_generations" in help_text and "--reward_model_path" in help_text
    flags = {"policy_path": policy_dir, "reward_model_path": reward_model_dir, "output_dir": tmp_path / "cli"}
    flags.update(prompts_per_step=1, num_generations=2, max_steps=1, eval_tasks=2, train_prompts=4)
    assert run_command("reward_models.finetune.grpo", flags)["steps"] == 1
    assert (tmp_path / "cli" / "tandem_artifact.json").is_file()
