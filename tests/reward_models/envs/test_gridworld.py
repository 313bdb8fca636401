from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reward_models.envs import GridWorld, training_seeds
from reward_models.envs.gridworld import Layout

REPO_ROOT = Path(__file__).resolve().parents[3]

# A   .   #        The only route: right, down, down, left (4 steps); "down" first bumps the wall.
# #   .   #
# G   .   .
CORRIDOR = ["A.#", "#.#", "G.."]
# A   .   .        Two shortest routes of 4 steps: down first or right first.
# .   #   .
# .   .   G
TWO_ROUTES = ["A..", ".#.", "..G"]


def play(env: GridWorld, task: dict, actions: list[str]):
    env.reset(task)
    return [env.step(action) for action in actions]


def test_generation_is_deterministic_per_seed():
    first, second = GridWorld(size=7), GridWorld(size=7)
    for seed in range(50):
        assert first.reset(first.make_task(seed)) == second.reset(second.make_task(seed))
    maps = {first.reset(first.make_task(seed)) for seed in range(50)}
    assert len(maps) == 50


def test_generation_is_stable_across_processes():
    # Task seeds are stored in the database, so a seed must name the same map in every worker process.
    code = "from reward_models.envs import GridWorld; e = GridWorld(); print(e.reset(e.make_task(123)))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    ).stdout.strip()
    env = GridWorld()
    assert other == env.reset(env.make_task(123))


@pytest.mark.parametrize("size", [5, 6, 7])
def test_every_generated_task_is_solvable_within_the_step_limit(size):
    env = GridWorld(size=size, wall_prob=0.3, max_steps=12)
    for seed in range(300):
        task = env.make_task(seed)
        oracle = env.oracle(task)
        assert 1 <= oracle.shortest_path_length() <= 12
        actions = []
        while not oracle.success(actions):
            actions.append(oracle.best_actions(actions)[0])
        assert len(actions) == oracle.shortest_path_length()
        assert play(env, task, actions)[-1].reward == 1.0


def test_observation_is_space_separated_cells_with_row_separators():
    env = GridWorld(size=6)
    observation = env.reset(env.make_task(0))
    rows = observation.split(" | ")
    assert len(rows) == 6
    assert all(len(row.split()) == 6 for row in rows)
    cells = observation.split()
    assert cells.count("A") == 1 and cells.count("G") == 1
    assert set(cells) <= {"#", ".", "A", "G", "|"}


def test_oracle_follows_the_only_route_on_a_hand_made_map():
    env = GridWorld(max_steps=10)
    oracle = env.oracle({"seed": 0, "instruction": "x", "layout": CORRIDOR})
    assert oracle.shortest_path_length() == 4
    assert oracle.best_actions([]) == ["right"]
    assert oracle.best_actions(["right"]) == ["down"]
    assert oracle.best_actions(["right", "down", "down"]) == ["left"]
    actions = ["down", "right", "down", "down", "left"]
    assert oracle.step_correct(actions) == [False, True, True, True, True]
    assert oracle.success(actions) and oracle.true_return(actions) == 1.0
    assert oracle.best_actions(actions) == []
    assert oracle.step_correct(["right", "up"]) == [True, False]
    assert not oracle.success(["right", "up"]) and oracle.true_return(["right", "up"]) == 0.0


def test_oracle_lists_every_optimal_move_and_ignores_actions_after_the_goal():
    oracle = GridWorld().oracle({"layout": TWO_ROUTES})
    assert oracle.best_actions([]) == ["down", "right"]
    assert oracle.step_correct(["right", "right", "down", "down", "up"]) == [True, True, True, True]


def test_oracle_stops_at_the_step_limit():
    oracle = GridWorld(max_steps=3).oracle({"layout": TWO_ROUTES})
    assert not oracle.success(["right", "right", "down", "down"])
    assert oracle.best_actions(["up", "up", "up"]) == []


def test_bumping_a_wall_keeps_the_agent_in_place_and_costs_a_step():
    env = GridWorld(max_steps=10)
    start = env.reset({"layout": CORRIDOR})
    bumped = env.step("down")
    assert bumped.observation == start
    assert (bumped.reward, bumped.done, bumped.info["invalid"]) == (0.0, False, False)
    edge = env.step("up")
    assert edge.observation == start


def test_an_unparseable_action_is_a_flagged_no_op():
    env = GridWorld(max_steps=10)
    start = env.reset({"layout": CORRIDOR})
    result = env.step("goal is ; dance")
    assert result.observation == start and result.info["invalid"] and not result.done
    assert env.step(" Right ").observation != start  # case and surrounding spaces are forgiven


def test_reaching_the_goal_ends_the_episode_with_reward_one():
    env = GridWorld(max_steps=10)
    results = play(env, {"layout": CORRIDOR}, ["right", "down", "down", "left"])
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].info["success"]
    with pytest.raises(RuntimeError):
        env.step("up")


def test_the_step_limit_ends_the_episode_without_reward():
    env = GridWorld(max_steps=3)
    results = play(env, {"layout": CORRIDOR}, ["up", "up", "up"])
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == 0.0 and not results[-1].info["success"]


def test_legal_actions_are_the_four_moves():
    env = GridWorld()
    env.reset(env.make_task(1))
    assert env.legal_actions() == ["up", "down", "left", "right"]


def test_render_gives_grid_rows_for_the_ui():
    env = GridWorld()
    observation = env.reset({"layout": CORRIDOR})
    payload = env.render(observation)
    assert payload["kind"] == "grid"
    assert payload["rows"] == [["A", ".", "#"], ["#", ".", "#"], ["G", ".", "."]]
    assert payload["text"] == observation
    json.dumps(payload)


def test_tasks_are_json_safe_and_carry_an_instruction():
    task = GridWorld().make_task(5)
    assert json.loads(json.dumps(task)) == task
    assert task["seed"] == 5 and task["instruction"]


def test_eval_seeds_are_200_fixed_held_out_tasks():
    env = GridWorld()
    assert env.eval_seeds() == GridWorld(size=7).eval_seeds()
    assert len(env.eval_seeds()) == 200


def test_training_seeds_skip_the_held_out_evaluation_seeds():
    env = GridWorld()
    held_out = env.eval_seeds()
    seeds = list(training_seeds(env, 300, start=held_out.start - 100))
    assert len(seeds) == 300 == len(set(seeds))
    assert not set(seeds) & set(held_out)
    assert seeds[99] == held_out.start - 1 and seeds[100] == held_out.stop


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["A.", "G"], "square"),
        (["A.", ".."], "exactly one"),
        (["AX", ".G"], "unknown cell"),
    ],
)
def test_hand_made_layouts_are_validated(rows, message):
    with pytest.raises(ValueError, match=message):
        Layout.from_rows(rows)


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"size": 2}, "size"), ({"wall_prob": 0.9}, "wall_prob"), ({"max_steps": 0}, "max_steps")]
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GridWorld(**kwargs)
