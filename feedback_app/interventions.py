"""Checking an intervention against the environment before it is stored, in the web request.

An intervention replaces the action at one step and, in takeover mode, plays further actions by hand. The
trajectory's own actions before that step are replayed as the policy played them (a policy's garbled action replays
as the environment's invalid no-op, as it did in the rollout); the annotator's actions must each be among the
environment's legal actions at their turn, and the episode must not end while annotator actions remain.

Messages number steps from 1, as the annotator pages do. One environment is built and replayed per call: for the
gridworld that is well under a millisecond; an environment whose reset is slow makes this slow too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ValidationError

from feedback_app.models import Step, Task, Trajectory
from reward_models.envs import Environment, StepResult, replay


def task_spec(task: Task) -> dict[str, Any]:
    """The task dict the environment's reset() takes: the stored spec, with the task's seed and instruction where
    the spec leaves them out (policies read the instruction from it)."""
    if not task.spec and task.seed is None:
        raise ValidationError(
            {"trajectory": f"Task {task.pk} has neither a spec nor a seed, so the environment cannot replay it."}
        )
    defaults: dict[str, Any] = {"instruction": task.instruction}
    if task.seed is not None:
        defaults["seed"] = task.seed
    return {**defaults, **task.spec}


def replay_correction(
    env: Environment,
    task: dict[str, Any],
    original_actions: Sequence[str],
    corrected_action: str,
    takeover_actions: Sequence[str] = (),
) -> list[StepResult]:
    """Replay `original_actions` (the steps before the intervention), then the annotator's corrected action and
    takeover actions, checking each of the annotator's against the legal actions. Returns one result per action.

    Raises ValidationError keyed ``step``, ``corrected_action`` or ``takeover_actions``.
    """
    branch = len(original_actions)
    results = _replay_original(env, task, original_actions)
    human = [corrected_action, *takeover_actions]
    for offset, action in enumerate(human):
        field = "corrected_action" if offset == 0 else "takeover_actions"
        legal = env.legal_actions()
        if action not in legal:
            where = "" if offset == 0 else f"step {branch + offset + 1}: "
            raise ValidationError({field: f"{where}{action!r} is not a legal action; legal: {', '.join(legal)}"})
        results.append(env.step(action))
        remaining = len(human) - offset - 1
        if results[-1].done and remaining:
            raise ValidationError(
                {
                    "takeover_actions": f"The episode ends at step {branch + offset + 1}, so the {remaining} "
                    f"takeover action{'s' if remaining > 1 else ''} after it cannot be played."
                }
            )
    return results


def legal_actions_at(trajectory: Trajectory, step_index: int) -> list[str]:
    """The environment's legal actions in the state before step `step_index` (0-based) of `trajectory`."""
    original = _actions_before(trajectory, step_index)
    env = trajectory.project.environment.load()
    _replay_original(env, task_spec(trajectory.task), original)
    return env.legal_actions()


def validate_correction(
    trajectory: Trajectory, step_index: int, corrected_action: str, takeover_actions: Sequence[str] = ()
) -> None:
    """Raise ValidationError (keyed ``corrected_action``, ``takeover_actions`` or ``step``) unless the annotator's
    actions at `step_index` (0-based) and after it can be played in the environment."""
    if not isinstance(takeover_actions, list | tuple) or not all(isinstance(a, str) for a in takeover_actions):
        raise ValidationError({"takeover_actions": "Give the takeover as a list of actions."})
    original = _actions_before(trajectory, step_index)
    env = trajectory.project.environment.load()
    replay_correction(env, task_spec(trajectory.task), original, corrected_action, takeover_actions)


def _replay_original(env: Environment, task: dict[str, Any], original_actions: Sequence[str]) -> list[StepResult]:
    """Replay the trajectory's own actions before the intervention, as the policy played them."""
    branch = len(original_actions)
    try:
        _, results = replay(env, task, original_actions, strict=False)
    except ValueError as exc:
        raise ValidationError({"step": f"The episode cannot be replayed up to step {branch + 1}: {exc}"}) from exc
    if results and results[-1].done:
        raise ValidationError({"step": f"The episode had already ended before step {branch + 1}."})
    return results


def _actions_before(trajectory: Trajectory, step_index: int) -> list[str]:
    if not 0 <= step_index < trajectory.num_steps:
        raise ValidationError(
            {"step": f"Trajectory {trajectory.pk} has no step {step_index + 1}; it has {trajectory.num_steps} steps."}
        )
    actions = list(
        Step.objects.filter(trajectory=trajectory, index__lt=step_index)
        .order_by("index")
        .values_list("action", flat=True)
    )
    if len(actions) != step_index:
        raise ValidationError({"step": f"Trajectory {trajectory.pk} is missing steps before step {step_index + 1}."})
    return actions
