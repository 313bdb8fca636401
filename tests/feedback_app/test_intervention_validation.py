"""An intervention is checked against the environment before it is stored: legal actions, and the episode's end."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from feedback_app.corrections import legal_actions_at, validate_correction
from feedback_app.models import Step, Task, Trajectory
from reward_models.envs.gridworld import ACTIONS, GridWorld
from tests.trajectories import save_steps

pytestmark = pytest.mark.django_db


@pytest.fixture
def oracle(task):
    return GridWorld().oracle(task.spec)


@pytest.fixture
def played(project, task):
    def make(actions: list[str], task=task) -> Trajectory:
        trajectory = Trajectory.objects.create(project=project, task=task, source="human", num_steps=len(actions))
        save_steps(trajectory, [Step(index=i, action=a) for i, a in enumerate(actions)])
        return trajectory

    return make


def _wander(oracle, n_steps: int) -> list[str]:
    actions: list[str] = []
    for _ in range(n_steps):
        actions.append(next(a for a in ACTIONS if a not in oracle.best_actions(actions)))
    return actions


def _error(excinfo) -> dict[str, str]:
    return {field: " ".join(messages) for field, messages in excinfo.value.message_dict.items()}


def test_the_legal_actions_are_the_environments(played, oracle):
    trajectory = played(_wander(oracle, 3))
    assert legal_actions_at(trajectory, 0) == legal_actions_at(trajectory, 2) == ["up", "down", "left", "right"]


def test_a_legal_correction_and_takeover_pass(played, oracle):
    actions = _wander(oracle, 4)
    trajectory = played(actions)
    corrected = oracle.best_actions(actions[:2])[0]
    validate_correction(trajectory, 2, corrected, [oracle.best_actions([*actions[:2], corrected])[0], "left"])


def test_an_illegal_corrected_action_names_the_field_and_the_legal_ones(played, oracle):
    trajectory = played(_wander(oracle, 3))
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 1, "teleport", [])
    assert _error(excinfo) == {"corrected_action": "'teleport' is not a legal action; legal: up, down, left, right"}


def test_an_illegal_takeover_action_names_its_step(played, oracle):
    trajectory = played(_wander(oracle, 3))
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 0, "up", ["down", "jump", "left"])
    # Steps are numbered from 1: the correction is step 1, the takeover steps 2, 3 and 4.
    assert _error(excinfo) == {
        "takeover_actions": "step 3: 'jump' is not a legal action; legal: up, down, left, right"
    }


def test_takeover_actions_after_the_episode_ends_are_refused(played, oracle):
    trajectory = played(_wander(oracle, 2))
    path: list[str] = []
    while best := oracle.best_actions(path):
        path.append(best[0])
    validate_correction(trajectory, 0, path[0], path[1:])  # ending exactly at the goal is fine
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 0, path[0], [*path[1:], "up", "up"])
    assert _error(excinfo) == {
        "takeover_actions": f"The episode ends at step {len(path)}, so the 2 takeover turns after it cannot be played."
    }


def test_the_step_limit_ends_the_episode_too(played, oracle):
    # The gridworld ends an episode after 15 steps: a takeover cannot run past it.
    trajectory = played(_wander(oracle, 14))
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 13, "down", ["down", "down"])
    assert "The episode ends at step 15, so the 1 takeover turn after it" in _error(excinfo)["takeover_actions"]


def test_a_step_outside_the_trajectory_or_after_its_end_is_refused(played, oracle):
    trajectory = played(_wander(oracle, 2))
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 5, "up")
    assert "has no step 6; it has 2 steps" in _error(excinfo)["step"]
    # A stored trajectory that kept going after the goal (an import, say) cannot be corrected past the goal.
    path: list[str] = []
    while best := oracle.best_actions(path):
        path.append(best[0])
    overlong = played([*path, "up"])
    with pytest.raises(ValidationError) as excinfo:
        legal_actions_at(overlong, len(path))
    assert "The episode had already ended before step" in _error(excinfo)["step"]


def test_garbled_policy_actions_in_the_prefix_replay_as_no_ops(played, oracle):
    trajectory = played(["uhh right?", *_wander(oracle, 2)])
    validate_correction(trajectory, 1, oracle.best_actions([])[0], [])


def test_a_malformed_takeover_is_refused(played, oracle):
    trajectory = played(_wander(oracle, 2))
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 0, "up", "down")
    assert "list of actions" in _error(excinfo)["takeover_actions"]


def test_a_task_the_environment_cannot_rebuild_is_refused(played, project):
    imported = Task.objects.create(project=project, instruction="book a flight", external_id="flight")
    trajectory = played(["search"], task=imported)
    with pytest.raises(ValidationError) as excinfo:
        validate_correction(trajectory, 0, "up")
    assert "without its task's seed or spec" in _error(excinfo)["trajectory"]


def test_the_task_spec_keeps_the_instruction_for_the_policy(task):
    assert task.reset_spec() == {"seed": 7, "instruction": "reach the goal"}
