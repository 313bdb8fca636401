"""bench/judge_oracle_metrics.py, the metric code of bench/judge_oracle.py (the oracle test of the judge models), on
hand-made episodes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from reward_models.conversation import StepTurn, build_conversation
from reward_models.policy.turns import judge_view
from simulation.episodes import OracleEpisode

BENCH = Path(__file__).resolve().parents[2] / "bench" / "judge_oracle_metrics.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("judge_oracle_metrics", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def episode(number: int, task: int, reasonings: list[str], *, success: bool, score: float) -> OracleEpisode:
    """An episode whose decisions state `reasonings` (one per step), each answered by the next observation (the last
    one "observation after"); the oracle facts are given, not derived."""
    prompt = [{"role": "system", "content": "reach the goal G"}, {"role": "user", "content": "observation 0"}]
    steps = len(reasonings)
    turns = [
        StepTurn(
            {"role": "assistant", "content": f"{reasoning} ; action right"},
            [{"role": "user", "content": f"observation {step + 1}" if step + 1 < steps else "observation after"}],
        )
        for step, reasoning in enumerate(reasonings)
    ]
    return OracleEpisode(
        trajectory_id=number,
        task_id=task,
        noise=0.0,
        conversation=build_conversation(prompt, turns),
        actions=["right"] * steps,
        rewards=[0.0] * (steps - 1) + [1.0 if success else 0.0],
        success=success,
        step_correct=[True] * steps,
        score=score,
    )


def test_stated_distance_reads_the_last_decision_before_its_action(bench):
    near = episode(1, 1, ["goal is down 3 right 2", "goal is up 0 left 1"], success=True, score=1.4)
    assert bench.stated_distance(near) == 1
    silent = episode(2, 1, ["action only"], success=False, score=0.0)
    silent.messages[-2]["content"] = "right"
    assert bench.stated_distance(silent) is None


def test_judged_pairs_orders_each_pair_by_oracle_return_and_leaves_out_equal_returns(bench):
    short = episode(1, 7, ["goal is down 1 right 0"], success=True, score=1.4)
    long = episode(2, 7, ["goal is down 2 right 0"] * 3, success=True, score=1.3)
    same_as_long = episode(3, 7, ["goal is down 2 right 0"] * 3, success=True, score=1.3)
    other_task = episode(4, 8, ["goal is down 1 right 0"], success=True, score=1.0)
    pairs = bench.judged_pairs([long, short, same_as_long, other_task])
    assert sorted((better.trajectory_id, worse.trajectory_id) for better, worse in pairs) == [(1, 2), (1, 3)]


def test_the_length_baseline_counts_a_tie_in_length_as_half_and_is_wrong_when_the_longer_one_is_better(bench):
    shorter_success = episode(1, 1, ["goal is down 1 right 0"] * 2, success=True, score=1.4)
    longer_success = episode(2, 1, ["goal is down 1 right 0"] * 4, success=True, score=1.3)
    near_failure = episode(3, 1, ["goal is down 1 right 1"] * 15, success=False, score=0.4)
    far_failure = episode(4, 1, ["goal is down 4 right 2"] * 15, success=False, score=0.1)
    shorter_wins = bench.BASELINES["shorter_wins"]
    assert shorter_wins(shorter_success, longer_success) == 1.0
    assert shorter_wins(near_failure, far_failure) == 0.5
    assert shorter_wins(longer_success, shorter_success) == 0.0
    nearer = bench.BASELINES["nearer_at_end_wins"]
    assert nearer(near_failure, far_failure) == 1.0
    assert nearer(shorter_success, longer_success) == 0.5
    both = bench.BASELINES["shorter_then_nearer_wins"]
    assert both(near_failure, far_failure) == 1.0 and both(shorter_success, longer_success) == 1.0
    assert bench.BASELINES["random"](far_failure, near_failure) == 0.5


def test_pair_accuracy_splits_by_pair_type_with_an_interval_around_the_mean(bench):
    episodes = []
    for task in range(4):
        episodes += [
            episode(10 * task + 1, task, ["goal is down 1 right 0"] * 2, success=True, score=1.4),
            episode(10 * task + 2, task, ["goal is down 1 right 0"] * 5, success=True, score=1.2),
            episode(10 * task + 3, task, ["goal is down 1 right 1"] * 15, success=False, score=0.4),
            episode(10 * task + 4, task, ["goal is down 4 right 2"] * 15, success=False, score=0.1),
        ]
    pairs = bench.judged_pairs(episodes)
    figures = bench.pair_accuracy(pairs, bench.BASELINES["shorter_wins"])
    assert figures["both_succeeded"] == {"pairs": 4, "accuracy": 1.0, "low": 1.0, "high": 1.0}
    assert figures["one_succeeded"]["pairs"] == 16 and figures["one_succeeded"]["accuracy"] == 1.0
    assert figures["both_failed"]["pairs"] == 4 and figures["both_failed"]["accuracy"] == 0.5
    assert figures["all"]["pairs"] == 24
    assert figures["all"]["accuracy"] == pytest.approx((4 + 16 + 2) / 24)
    # The reward model's outcome: a higher reward for the oracle's better trajectory is right.
    reward = {e.trajectory_id: (-e.score if e.success else e.score) for e in episodes}
    figures = bench.pair_accuracy(pairs, lambda b, w: float(reward[b.trajectory_id] > reward[w.trajectory_id]))
    assert figures["both_succeeded"]["accuracy"] == 0.0 and figures["both_failed"]["accuracy"] == 1.0
    assert figures["all"]["low"] <= figures["all"]["accuracy"] <= figures["all"]["high"]


def test_the_decisions_layout_empties_every_observation_but_the_first_and_the_last(bench):
    messages = episode(
        1, 1, ["goal is down 3 right 0", "goal is down 2 right 0", "goal is down 1 right 0"], success=True, score=1.4
    ).messages
    elided = judge_view(messages, "decisions")
    assert [m["role"] for m in elided] == [m["role"] for m in messages]
    assert [m["content"] for m in elided if m["role"] == "user"] == ["observation 0", "", "", "observation after"]
    assert [m for m in elided if m["role"] != "user"] == [m for m in messages if m["role"] != "user"]
    assert messages[3]["content"] == "observation 1"  # the input is not changed


def test_the_step_baseline_calls_a_step_good_when_its_action_goes_where_the_reasoning_says(bench):
    assert bench.follows_reasoning("goal is down 2 left 1 ; action down")
    assert bench.follows_reasoning("goal is down 2 left 1 ; action left")
    assert not bench.follows_reasoning("goal is down 2 left 0 ; action left")
    assert not bench.follows_reasoning("goal is down 2 left 1 ; action up")
    assert not bench.follows_reasoning("right")


def test_the_moves_judge_reads_where_the_last_action_led(bench):
    near = episode(1, 1, ["goal is down 2 right 0", "goal is down 1 right 0"], success=False, score=0.5)
    viewed = judge_view(near.messages, "moves")
    assert [m["content"] for m in viewed if m["role"] == "user"] == ["observation 0", "", "observation after"]
    assert bench.stated_distance(near) == 1
