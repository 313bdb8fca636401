"""Replaying an annotator's correction without Django: each reason is keyed by the intervention field it concerns."""

from __future__ import annotations

import pytest

from reward_models.envs.corrections import CorrectionError, replay_correction, turn_message
from reward_models.envs.gridworld import GridWorld
from reward_models.envs.toolshop import ToolShop
from reward_models.envs.toolshop_tools import TOOL_SCHEMAS, tool_call_message


def test_a_legal_correction_and_takeover_replay_to_one_result_per_turn():
    env = GridWorld()
    task = env.make_task(7)
    best = env.oracle(task).best_actions([])[0]
    original = [turn_message(env, best)]
    following = env.oracle(task).best_actions([best])[0]

    results = replay_correction(env, task, original, turn_message(env, following, "towards the goal"))

    assert len(results) == 2
    assert original[0]["content"].endswith(f"action {best}")


def test_an_illegal_move_is_refused_on_the_corrected_action_and_names_the_legal_ones():
    env = GridWorld()
    task = env.make_task(7)

    with pytest.raises(CorrectionError) as raised:
        replay_correction(env, task, [], turn_message(env, "jump"))

    assert list(raised.value.errors) == ["corrected_action"]
    assert "'jump' is not a legal action" in raised.value.errors["corrected_action"]
    assert "corrected_action: " in str(raised.value)


def test_an_empty_turn_and_an_unknown_tool_are_refused_before_the_environment_plays_them():
    env = ToolShop()
    task = env.make_task(3)

    with pytest.raises(CorrectionError) as empty:
        replay_correction(env, task, [], {"role": "assistant", "content": "  "})
    with pytest.raises(CorrectionError) as unknown:
        replay_correction(env, task, [], tool_call_message([("teleport", {})]), tools=TOOL_SCHEMAS)

    assert empty.value.errors == {"corrected_action": "write a turn: a tool call or some text."}
    assert list(unknown.value.errors) == ["tool_calls.0.name"]
    assert "'teleport' is not one of this task's tools" in unknown.value.errors["tool_calls.0.name"]


def test_takeover_turns_past_the_end_of_the_episode_are_refused():
    env = GridWorld()
    task = env.make_task(7)
    oracle = env.oracle(task)
    path: list[str] = []
    while True:  # the shortest path to the goal, then one turn too many
        path.append(oracle.best_actions(path)[0])
        env.reset(task)
        if [env.step(move) for move in path][-1].done:
            break
    turns = [turn_message(env, move) for move in [*path, path[-1]]]

    with pytest.raises(CorrectionError) as raised:
        replay_correction(env, task, [], turns[0], turns[1:])

    assert list(raised.value.errors) == ["takeover_actions"]
    assert f"The episode ends at step {len(path)}" in raised.value.errors["takeover_actions"]
