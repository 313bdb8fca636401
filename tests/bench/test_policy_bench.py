"""The parts of bench/policy_bench.py that train nothing: the unit of labels, the noise every simulated annotator
shares, and the reading of several seeds together."""

from __future__ import annotations

import pytest

from reward_models.envs.gridworld import GridWorld
from reward_models.finetune.grpo import first_step_preference_rows
from reward_models.policy.turns import parse_decision
from simulation import oracle_data
from simulation.episodes import scripted_episodes
from tests.bench.test_loop_bench import BENCH as LOOP_BENCH
from tests.bench.test_loop_bench import _load_bench

BENCH = LOOP_BENCH.parent / "policy_bench.py"


@pytest.fixture(scope="module")
def bench():
    return _load_bench(BENCH, "policy_bench")


def test_every_method_learns_in_the_same_unit_of_annotator_actions(bench):
    rows = [{"labels": [True, False, True]}, {"labels": [False]}]
    assert bench.annotator_actions("stepwise.jsonl", rows) == 4  # one per labelled step
    assert bench.annotator_actions("preference.jsonl", rows) == 2  # one per comparison
    # Every method of the race is in it, and none keeps a checkpoint chosen by the environment's true success.
    assert set(bench.TRAINERS) == set(bench.METHODS)
    assert {"sft", "dpo", "dpo_trajectory", "kto", "ppo", "nash_md", "spo", "grpo", "ppo_oracle"} <= set(bench.METHODS)
    for name in ("ppo", "ppo_oracle"):
        assert bench.TRAINERS[name][4]["selection_tasks"] == 0


def test_a_method_over_seeds_gets_the_paired_gain_of_its_seed_averaged_success_and_the_seed_spread(bench):
    base = {"greedy_per_task": [0.0, 1.0, 0.0, 1.0], "sampled_per_task": [0.0, 0.5, 0.5, 1.0]}
    runs = [
        {"seed": 0, "actions": 10, "wall_seconds": 4.0, "final": {"greedy_per_task": [1.0, 1.0, 0.0, 1.0]}},
        {"seed": 1, "actions": 12, "wall_seconds": 6.0, "final": {"greedy_per_task": [1.0, 1.0, 1.0, 1.0]}},
        {"seed": 2, "actions": 11, "wall_seconds": 5.0, "final": {"greedy_per_task": [0.0, 1.0, 0.0, 1.0]}},
    ]
    for run in runs:
        run["final"]["sampled_per_task"] = base["sampled_per_task"]
    summary = bench.summarise("sft", runs, base)
    greedy = summary["gains"]["greedy"]
    assert greedy["per_seed"] == pytest.approx([0.25, 0.5, 0.0])
    # Per task, the seeds' mean minus the base: (2/3, 0, 1/3, 0); their mean and its standard error over tasks.
    assert greedy["paired"][0] == pytest.approx(0.25)
    squares = (2 / 3 - 0.25) ** 2 + 2 * 0.25**2 + (1 / 3 - 0.25) ** 2
    assert greedy["paired"][1] == pytest.approx((squares / 3 / 4) ** 0.5)
    assert greedy["seed_se"] == pytest.approx(0.25 / 3**0.5)
    assert summary["gains"]["sampled"]["paired"] == (0.0, 0.0)
    assert (summary["actions"], summary["wall_seconds"], summary["success"]["greedy"]) == (11, 5.0, 0.75)


def test_interventions_and_first_decision_comparisons_err_at_the_shared_rate():
    env = GridWorld()
    episodes = scripted_episodes(300, per_task=1, noises=(1.0,), seed=0)
    for epsilon, low, high in ((0.0, 0.0, 0.0), (0.3, 0.2, 0.4)):
        rows = oracle_data.intervention_step_preference_rows(episodes, seed=1, epsilon=epsilon)
        wrong = 0
        for row in rows:
            episode = next(e for e in episodes if e.trajectory_id == row["rejected_trajectory_id"])
            best = env.oracle(env.make_task(episode.task_id)).best_actions(episode.actions[: row["step_index"]])
            wrong += row["chosen_action"] not in best
        assert len(rows) > 100 and low <= wrong / len(rows) <= high
    for epsilon, low, high in ((0.0, 0.0, 0.0), (0.3, 0.2, 0.4)):
        rows = first_step_preference_rows(300, pairs_per_task=1, epsilon=epsilon, seed=2)
        wrong = 0
        for row in rows:
            best = env.oracle(env.make_task(row["task_id"])).best_actions([])
            wrong += parse_decision(row["chosen"][0]["content"])[1] not in best
        assert low <= wrong / len(rows) <= high
