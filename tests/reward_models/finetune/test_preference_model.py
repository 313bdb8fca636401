"""The pairwise preference model for the Nash-style trainers: antisymmetric by construction, able to hold
intransitive preferences, trained on oracle-labelled gridworld comparisons with a tiny Llama on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from reward_models.common.artifacts import read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune.preference_model import PreferenceModelConfig, main
from reward_models.finetune.preference_scoring import (
    PreferenceModel,
    RewardModelPreference,
    load_preference_model,
    pair_scores,
)
from reward_models.policy.turns import elide_observations, judge_view
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows, write_jsonl
from tests.launch import command_help, flag_arguments, run_launched
from tests.reward_models import tool_chat
from tests.reward_models.reporters import RecordingReporter, assert_finished_returns_summary, resumed_after_cancel

SMALL_GRID = {"size": 4, "max_steps": 6}
FAST = {"batch_size": 8, "learning_rate": 5e-3, "logging_steps": 1, "save_steps": 1000}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return preference_rows(scripted_episodes(30, per_task=4, seed=0, env_config=SMALL_GRID), ties="include")


@pytest.fixture(scope="module")
def data_path(rows, tmp_path_factory) -> Path:
    return write_jsonl(rows, tmp_path_factory.mktemp("pm-data") / "preference.jsonl")


def make_config(data_path, base, output_dir, **overrides) -> PreferenceModelConfig:
    return PreferenceModelConfig(
        data_path=str(data_path), base_model=str(base), output_dir=str(output_dir), **{**FAST, **overrides}
    )


@pytest.fixture(scope="module")
def trained(data_path, tiny_base_model, tmp_path_factory):
    reporter = RecordingReporter()
    config = make_config(data_path, tiny_base_model, tmp_path_factory.mktemp("pm") / "run", max_steps=40)
    return config, main(config, reporter), reporter


def test_pair_scores_are_antisymmetric_so_both_orders_sum_to_one():
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 5, generator=generator), torch.randn(5, 5, generator=generator)
    assert torch.allclose(pair_scores(a, b), -pair_scores(b, a))
    assert torch.allclose(pair_scores(a, b).sigmoid() + pair_scores(b, a).sigmoid(), torch.ones(5))
    assert torch.equal(pair_scores(a, a), torch.zeros(5))


def test_the_skew_part_expresses_an_intransitive_cycle_no_reward_model_can():
    # Three embeddings 120 degrees apart on the unit circle, equal scores: a > b, b > c and c > a.
    angles = [0.0, 2 * math.pi / 3, 4 * math.pi / 3]
    heads = torch.tensor([[0.0, math.cos(t), math.sin(t)] for t in angles])
    a, b, c = heads
    for first, second in ((a, b), (b, c), (c, a)):
        assert pair_scores(first, second) > 0.8
    # With the skew part off (Bradley-Terry) equal scores can only tie.
    assert pair_scores(a[:1], b[:1]) == 0


# A decision with reasoning, one with no action marker (taken whole as the action) and a bare action.
LAYOUT_MESSAGES = [
    {"role": "system", "content": "reach the goal G"},
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "goal is down 1 ; action down"},
    {"role": "user", "content": "middle"},
    {"role": "assistant", "content": "goal is down 0"},
    {"role": "user", "content": "last"},
    {"role": "assistant", "content": "left"},
]


def test_decisions_layout_empties_every_observation_but_the_first_and_last():
    messages = LAYOUT_MESSAGES
    assert [m["content"] for m in elide_observations(messages) if m["role"] == "user"] == ["first", "", "last"]
    assert [m for m in elide_observations(messages) if m["role"] != "user"] == [
        m for m in messages if m["role"] != "user"
    ]
    assert elide_observations(messages) == judge_view(messages, "decisions")


def test_the_actions_and_moves_layouts_keep_each_action_and_drop_the_reasoning():
    messages = [dict(message) for message in LAYOUT_MESSAGES]
    actions = judge_view(messages, "actions")
    assert [m["content"] for m in actions] == [
        "reach the goal G",
        "first",
        "action down",
        "middle",
        "action goal is down 0",
        "last",
        "action left",
    ]
    moves = judge_view(messages, "moves")
    assert [m["content"] for m in moves if m["role"] == "user"] == ["first", "", "last"]
    assert [m["content"] for m in moves if m["role"] == "assistant"] == [
        "action down",
        "action goal is down 0",
        "action left",
    ]
    assert messages[2]["content"] == "goal is down 1 ; action down"  # the input is left as it was
    with pytest.raises(ValueError, match="layout must be one of full, decisions, actions, moves"):
        judge_view(messages, "reasoning")


def test_the_layouts_read_tool_calls_as_actions_and_tool_results_as_observations():
    messages = tool_chat.trajectory(2, 2).messages
    actions = judge_view(messages, "actions")
    # The calls are the action, written as a field or as markup; the thought around them is reasoning.
    assert actions[2] == {**messages[2], "content": ""} and actions[2]["tool_calls"] == messages[2]["tool_calls"]
    assert actions[4]["content"].startswith("<tool_call>") and "found it" not in actions[4]["content"]
    assert [m for m in actions if m["role"] != "assistant"] == [m for m in messages if m["role"] != "assistant"]
    decisions = judge_view(messages, "decisions")
    # The prompt and the last observation are kept; the tool results between are emptied.
    assert decisions[:2] == messages[:2] and decisions[-1] == messages[-1]
    assert [m["content"] for m in decisions if m["role"] == "tool"] == ["", ""]


def test_a_preference_model_on_tool_calls_reads_rows_through_the_chat_template_with_their_tools(
    tool_policy_dir, tmp_path
):
    rows = tool_chat.preference_rows()
    data = write_jsonl(rows, tmp_path / "pairs.jsonl")
    config = PreferenceModelConfig(
        data_path=str(data), base_model=str(tool_policy_dir), output_dir=str(tmp_path / "pm"), max_steps=2, **FAST
    )
    assert main(config)["steps"] == 2
    model = load_preference_model(tmp_path / "pm", "cpu")
    row = rows[0]
    read = model.tokenizer.decode(model.encode(row["prompt"], row["chosen"], row["tools"]))
    assert read == model.tokenizer.apply_chat_template(
        row["prompt"] + row["chosen"], tools=row["tools"], tokenize=False
    )
    assert tool_chat.TOOLS_BLOCK in read
    [forward], [backward] = (
        model.probability([pair], [row["tools"]])
        for pair in ((row["prompt"], row["chosen"], row["rejected"]), (row["prompt"], row["rejected"], row["chosen"]))
    )
    assert forward + backward == pytest.approx(1.0)


def test_training_lowers_the_loss_and_beats_chance_on_held_out_tasks(trained):
    config, summary, reporter = trained
    losses = reporter.series("loss")
    assert len(losses) == 40
    assert summary["final_loss"] < summary["initial_loss"] - 0.1
    assert all(math.isfinite(loss) for loss in losses)
    assert [current for current, _ in reporter.steps] == list(range(1, 41))
    metrics = summary["metrics"]
    assert metrics["pairs"] > 10
    assert metrics["accuracy"] > 0.65
    assert summary["labels_used"] == summary["train_samples"] > 0
    assert summary["samples_per_second"] > 0
    assert read_manifest(config.output_dir)["kind"] == "preference_model"


def test_the_loader_gives_symmetric_probabilities_and_a_matching_win_matrix(trained, rows):
    config, _, _ = trained
    model = load_preference_model(config.output_dir, "cpu")
    assert isinstance(model, PreferenceModel)
    row = next(row for row in rows if not row.get("tie"))
    forward, backward = model.probability(
        [(row["prompt"], row["chosen"], row["rejected"]), (row["prompt"], row["rejected"], row["chosen"])]
    )
    assert forward + backward == pytest.approx(1.0, abs=1e-6)
    matrix = model.win_matrix(row["prompt"], [row["chosen"], row["rejected"]])
    assert matrix[0][0] == pytest.approx(0.5)
    assert matrix[0][1] == pytest.approx(forward, abs=1e-6)


def test_a_bradley_terry_reward_model_directory_loads_behind_the_same_interface(data_path, tiny_base_model, tmp_path):
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.model import load_reward_model
    from reward_models.reward.train import main as train_reward

    config = RewardConfig(
        data_path=str(data_path), base_model=str(tiny_base_model), output_dir=str(tmp_path / "rm"), max_steps=3, **FAST
    )
    train_reward(config)
    wrapped = load_preference_model(config.output_dir, "cpu")
    assert isinstance(wrapped, RewardModelPreference)
    prompt = [{"role": "system", "content": "reach the goal G"}, {"role": "user", "content": ". A G ."}]
    a = [{"role": "assistant", "content": "goal is right 1 ; action right"}]
    b = [{"role": "assistant", "content": "goal is right 1 ; action left"}]
    (reward_a, reward_b), _ = load_reward_model(config.output_dir, "cpu").score([prompt, prompt], [a, b])
    (probability,) = wrapped.probability([(prompt, a, b)])
    assert probability == pytest.approx(1 / (1 + math.exp(reward_b - reward_a)), abs=1e-5)
    assert wrapped.win_matrix(prompt, [a, b])[0][1] == pytest.approx(probability, abs=1e-5)


def test_a_cancelled_run_resumes_from_its_checkpoint(data_path, tiny_base_model, tmp_path):
    config = make_config(data_path, tiny_base_model, tmp_path / "run", max_steps=6, save_steps=2)
    summary, reporter = resumed_after_cancel(main, config, raise_at=5)
    assert summary["resumed_from"].endswith("step-4")
    assert [current for current, _ in reporter.steps] == [5, 6]
    assert_finished_returns_summary(main, config, summary)


def test_bad_settings_name_the_field(data_path, tiny_base_model, tmp_path):
    base = {"data_path": str(data_path), "base_model": str(tiny_base_model), "output_dir": str(tmp_path)}
    for field_name, value in (("layout", "images"), ("skew_dims", -1), ("ties", "keep")):
        with pytest.raises(ConfigError) as error:
            config_from_dict(PreferenceModelConfig, {**base, field_name: value})
        assert error.value.field == field_name
    with pytest.raises(ConfigError, match="preference_model_path"):
        load_preference_model(tmp_path)


def test_command_line_help_lists_the_settings():
    shown = command_help("reward_models.finetune.preference_model")
    assert "--skew_dims" in shown and "--layout" in shown


def test_the_command_line_trains_across_two_processes(data_path, rows, tiny_base_model, tmp_path):
    # Each process takes half of every batch; the first one alone saves the model and prints the summary.
    flags = {**FAST, "data_path": data_path, "base_model": tiny_base_model, "output_dir": tmp_path / "run"}
    flags.update(max_steps=4, logging_steps=2)
    summary = json.loads(run_launched("reward_models.finetune.preference_model", flag_arguments(flags)).stdout)
    assert summary["steps"] == 4 and math.isfinite(summary["final_loss"]) and summary["metrics"]["pairs"] > 10
    row = next(row for row in rows if not row.get("tie"))
    forward, backward = load_preference_model(tmp_path / "run", "cpu").probability(
        [(row["prompt"], row["chosen"], row["rejected"]), (row["prompt"], row["rejected"], row["chosen"])]
    )
    assert forward + backward == pytest.approx(1.0, abs=1e-6)
