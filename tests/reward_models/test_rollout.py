from __future__ import annotations

import json
import math
from functools import partial

import pytest

from reward_models.envs import GridWorld, load_environment, replay
from reward_models.policy import LocalCausalLMPolicy
from reward_models.rollout import continue_episode, evaluate_success, paired_difference, rollout

GRIDWORLD = partial(load_environment, "reward_models.envs.gridworld.GridWorld", {"size": 7, "max_steps": 15})


def tasks(count: int, start: int = 0) -> list[dict]:
    env = GRIDWORLD()
    return [env.make_task(seed) for seed in range(start, start + count)]


def step_view(episode):
    return [(s.observation, s.text, s.action, s.reward, s.done) for s in episode.steps]


def test_rollout_runs_every_sample_of_every_task_in_lockstep(oracle_policy):
    policy = oracle_policy()
    episodes = rollout(GRIDWORLD, tasks(3), policy, samples_per_task=2)
    assert [(e.task["seed"], e.sample_index) for e in episodes] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    # One batched call per turn for all unfinished episodes, shrinking as episodes end.
    assert policy.batch_sizes[0] == 6
    assert policy.batch_sizes == sorted(policy.batch_sizes, reverse=True)
    assert len(policy.batch_sizes) == max(e.length for e in episodes)


def test_an_optimal_policy_succeeds_and_the_oracle_agrees(oracle_policy):
    for episode in rollout(GRIDWORLD, tasks(10), oracle_policy()):
        oracle = GRIDWORLD().oracle(episode.task)
        assert episode.success and episode.total_reward == 1.0 and not episode.truncated
        assert episode.length == oracle.shortest_path_length()
        assert episode.oracle.step_correct == [True] * episode.length
        assert episode.oracle.true_return == 1.0 and episode.oracle.success
        assert episode.steps[-1].done and not any(s.done for s in episode.steps[:-1])


def test_a_wrong_policy_fails_and_every_step_is_marked_incorrect(oracle_policy):
    for episode in rollout(GRIDWORLD, tasks(5), oracle_policy(wrong=True)):
        assert not episode.success and episode.length == 15
        assert episode.oracle.step_correct == [False] * 15


def test_steps_record_what_the_policy_saw_and_the_render_payload(oracle_policy):
    episode = rollout(GRIDWORLD, tasks(1), oracle_policy())[0]
    env = GRIDWORLD()
    first_observation, results = replay(env, episode.task, episode.actions)
    assert episode.steps[0].observation == first_observation
    assert [s.observation for s in episode.steps[1:]] == [r.observation for r in results[:-1]]
    assert episode.final_observation == results[-1].observation
    assert episode.steps[0].render == env.render(first_observation)
    assert rollout(GRIDWORLD, tasks(1), oracle_policy(), render=False)[0].steps[0].render is None


def test_episodes_serialise_to_json_with_the_oracle_apart(oracle_policy):
    episode = rollout(GRIDWORLD, tasks(1), oracle_policy())[0]
    data = json.loads(json.dumps(episode.to_dict()))
    assert set(data["oracle"]) == {"true_return", "step_correct", "success"}
    assert "oracle" not in data["steps"][0]


def test_progress_reports_finished_episodes(oracle_policy):
    calls = []
    rollout(GRIDWORLD, tasks(4), oracle_policy(), progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (4, 4)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_max_turns_truncates_an_episode(oracle_policy):
    episode = rollout(GRIDWORLD, tasks(1), oracle_policy(wrong=True), max_turns=4)[0]
    assert episode.length == 4 and episode.truncated and not episode.success


def test_rollout_validates_its_arguments(oracle_policy):
    with pytest.raises(ValueError, match="samples_per_task"):
        rollout(GRIDWORLD, tasks(1), oracle_policy(), samples_per_task=0)
    with pytest.raises(ValueError, match="prefixes"):
        rollout(GRIDWORLD, tasks(2), oracle_policy(), prefixes=[["up"]])


def test_prefix_continuation_replays_the_prefix_exactly(local_policy):
    task = tasks(1, start=42)[0]
    original = rollout(GRIDWORLD, [task], local_policy, greedy=False, seed=1)[0]
    assert original.length >= 3
    # An annotator keeps two steps and corrects the third.
    oracle = GRIDWORLD().oracle(task)
    kept = [s.text for s in original.steps[:2]]
    correction = oracle.best_actions(original.actions[:2])[0]
    child = continue_episode(GRIDWORLD, task, [*kept, correction], local_policy)
    assert step_view(original)[:2] == step_view(child)[:2]
    assert [s.from_prefix for s in child.steps[:4]] == [True, True, True, False][: min(4, child.length)]
    assert child.steps[2].action == correction and child.steps[2].logprob is None
    assert child.steps[2].observation == original.steps[2].observation
    _, results = replay(GRIDWORLD(), task, child.actions)
    assert [r.observation for r in results[:-1]] == [s.observation for s in child.steps[1:]]
    assert child.oracle.step_correct[2] is True


def test_a_prefix_that_finishes_the_episode_needs_no_policy_turn(oracle_policy):
    task = tasks(1, start=3)[0]
    oracle = GRIDWORLD().oracle(task)
    solution = []
    while not oracle.success(solution):
        solution.append(oracle.best_actions(solution)[0])
    policy = oracle_policy(wrong=True)
    episode = continue_episode(GRIDWORLD, task, solution, policy)
    assert episode.success and episode.actions == solution and policy.batch_sizes == []


def test_batched_greedy_rollout_equals_unbatched(local_policy):
    batch = tasks(8, start=100)
    together = rollout(GRIDWORLD, batch, local_policy)
    alone = [rollout(GRIDWORLD, [task], local_policy)[0] for task in batch]
    assert [step_view(e) for e in together] == [step_view(e) for e in alone]


def test_batched_rollout_with_history_and_uneven_prefixes_equals_unbatched(policy_dir):
    # A full-history policy with prefixes of different lengths gives prompts of different lengths in one batch.
    policy = LocalCausalLMPolicy(policy_dir)
    policy.history_window = 2
    batch = tasks(5, start=200)
    prefixes = [["up"], [], ["left", "left", "down"], ["right"], ["down", "down"]]
    together = rollout(GRIDWORLD, batch, policy, prefixes=prefixes, max_turns=6)
    alone = [
        rollout(GRIDWORLD, [t], policy, prefixes=[p], max_turns=6)[0] for t, p in zip(batch, prefixes, strict=True)
    ]
    assert [step_view(e) for e in together] == [step_view(e) for e in alone]


def test_sampled_rollouts_are_deterministic_under_a_seed(local_policy):
    batch = tasks(6, start=300)
    first = rollout(GRIDWORLD, batch, local_policy, samples_per_task=2, greedy=False, temperature=1.5, seed=11)
    again = rollout(GRIDWORLD, batch, local_policy, samples_per_task=2, greedy=False, temperature=1.5, seed=11)
    other = rollout(GRIDWORLD, batch, local_policy, samples_per_task=2, greedy=False, temperature=1.5, seed=12)
    assert [step_view(e) for e in first] == [step_view(e) for e in again]
    assert [step_view(e) for e in first] != [step_view(e) for e in other]
    # Two samples of one task differ: each episode draws its own tokens.
    assert any(step_view(first[2 * i]) != step_view(first[2 * i + 1]) for i in range(6))


def test_evaluate_success_reports_rate_and_standard_error(oracle_policy):
    seeds = list(GridWorld().eval_seeds())[:20]
    perfect = evaluate_success(oracle_policy(), GRIDWORLD, seeds)
    assert perfect["success_rate"] == 1.0 and perfect["stderr"] == 0.0 and perfect["episodes"] == 20
    hopeless = evaluate_success(oracle_policy(wrong=True), GRIDWORLD, seeds, samples=2)
    assert hopeless["success_rate"] == 0.0 and hopeless["pass_at_k"] == 0.0 and hopeless["episodes"] == 40


def test_evaluate_success_of_the_tiny_policy_is_a_rate(local_policy):
    seeds = list(GridWorld().eval_seeds())[:12]
    result = evaluate_success(local_policy, GRIDWORLD, seeds, greedy=False, samples=2, seed=0)
    assert 0.0 <= result["success_rate"] <= result["pass_at_k"] <= 1.0
    assert result["stderr"] >= 0.0 and result["mean_length"] >= 1
    assert len(result["task_rates"]) == 12 and set(result["task_rates"]) <= {0.0, 0.5, 1.0}
    assert sum(result["task_rates"]) / 12 == pytest.approx(result["success_rate"])


def test_a_paired_difference_removes_the_spread_between_tasks():
    before = [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]  # half the tasks are easy
    after = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # two hard ones turned
    gain, stderr = paired_difference(before, after)
    assert gain == pytest.approx(2 / 6)
    # sd of the differences [1,0,0,0,1,0] over sqrt(6); the unpaired error of either rate alone is larger.
    assert stderr == pytest.approx(math.sqrt((2 * (2 / 3) ** 2 + 4 * (1 / 3) ** 2) / 5 / 6))
    assert paired_difference(before, before) == (0.0, 0.0)
    with pytest.raises(ValueError):
        paired_difference(before, after[:3])
