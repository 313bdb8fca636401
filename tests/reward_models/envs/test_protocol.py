from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reward_models.envs import Environment, GridWorld, episode_success, load_environment, replay

REPO_ROOT = Path(__file__).resolve().parents[3]
CORRIDOR = ["A.#", "#.#", "G.."]


def test_load_environment_builds_the_class_with_its_config():
    env = load_environment("reward_models.envs.gridworld.GridWorld", {"size": 7, "max_steps": 9})
    assert isinstance(env, GridWorld) and isinstance(env, Environment)
    assert (env.size, env.max_steps) == (7, 9)
    observation = env.reset(env.make_task(3))
    assert len(observation.split(" | ")) == 7


@pytest.mark.parametrize(
    ("path", "config", "message"),
    [
        ("GridWorld", None, "dotted path"),
        ("reward_models.envs.no_such_module.GridWorld", None, "cannot import module"),
        ("reward_models.envs.gridworld.NoSuchWorld", None, "has no 'NoSuchWorld'"),
        ("reward_models.envs.gridworld.ACTIONS", None, "not a class"),
        ("collections.OrderedDict", None, "is not an environment"),
        ("reward_models.envs.gridworld.GridWorld", {"colour": "red"}, "rejected its config"),
    ],
)
def test_load_environment_errors_name_the_path(path, config, message):
    with pytest.raises(ValueError, match=message) as error:
        load_environment(path, config)
    assert path in str(error.value)


def test_replay_plays_the_actions_and_leaves_the_environment_there():
    env = GridWorld(max_steps=10)
    first, results = replay(env, {"layout": CORRIDOR}, ["right", "down"])
    assert first.startswith("A")
    assert [r.done for r in results] == [False, False]
    assert env.step("down").observation == ". . # | # . # | G A ."


def test_strict_replay_rejects_an_illegal_action_and_lenient_replay_plays_it():
    env = GridWorld(max_steps=10)
    with pytest.raises(ValueError, match="action 1 .'jump'. is not legal"):
        replay(env, {"layout": CORRIDOR}, ["right", "jump"])
    _, results = replay(env, {"layout": CORRIDOR}, ["right", "jump"], strict=False)
    assert results[1].info["invalid"]


def test_replay_rejects_actions_after_the_episode_ended():
    env = GridWorld(max_steps=10)
    with pytest.raises(ValueError, match="after the episode ended"):
        replay(env, {"layout": CORRIDOR}, ["right", "down", "down", "left", "up"])


def test_success_comes_from_the_final_info_else_from_a_positive_return():
    assert episode_success(0.0, {"success": True})
    assert not episode_success(5.0, {"success": False})
    assert episode_success(0.5, {})
    assert not episode_success(0.0, {})


def test_envs_and_rollout_import_without_torch():
    # The web process imports these on every request path; torch would add seconds to its start-up.
    code = "import sys, reward_models.envs, reward_models.rollout, reward_models.policy; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "False"
