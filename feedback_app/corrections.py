"""Checking an intervention against the environment before it is stored, in the web request.

An intervention replaces the agent's turn at one step with the annotator's (an assistant message: a move picked from
the environment's legal actions, an edited tool call, or free text) and, in takeover mode, plays further turns by
hand. The trajectory's own turns before that step are replayed as the agent played them (a garbled turn replays as
the environment answered it); each of the annotator's turns must be legal where the environment lists legal
actions, its tool calls must name the task's tools with arguments that match their JSON schemas, and the episode
must not end while annotator turns remain.

Messages number steps from 1, as the annotator pages do. One environment is built and replayed per call: for the
built-in environments that is well under a millisecond; an environment whose reset is slow makes this slow too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ValidationError

from feedback_app.models import Step, Trajectory
from reward_models.conversation import Message
from reward_models.envs import Environment, StepResult, corrections
from reward_models.envs.base import task_tools
from reward_models.envs.corrections import CorrectionError, turn_message


def replay_turns(
    env: Environment,
    task: dict[str, Any],
    original: Sequence[Message],
    turns: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[StepResult]:
    """Replay the trajectory's `original` turns, then the annotator's `turns` (the corrected one first, then any
    taken over), as `reward_models.envs.corrections.replay_correction` does; its reasons are raised as the
    ValidationError the forms and the API show beside their fields."""
    try:
        return corrections.replay_correction(env, task, original, turns[0], turns[1:], tools)
    except CorrectionError as exc:
        raise ValidationError(exc.errors) from exc


def legal_actions_at(trajectory: Trajectory, step_index: int) -> list[str]:
    """The environment's legal actions in the state before step `step_index` (0-based) of `trajectory` (none for an
    open action space)."""
    original = messages_before(trajectory, step_index)
    env = trajectory.project.environment.load()
    try:
        corrections.replay_original(env, trajectory.task.reset_spec(), original)
    except CorrectionError as exc:
        raise ValidationError(exc.errors) from exc
    return env.legal_actions()


def validate_correction(
    trajectory: Trajectory, step_index: int, corrected: Message | str, takeover: Sequence[Message | str] = ()
) -> list[StepResult]:
    """Raise ValidationError (keyed as `replay_turns`'s) unless the annotator's turns at `step_index` (0-based)
    and after it can be played in the environment; else the environment's results, one per turn. A turn is an
    assistant message or an action picked from the legal ones (`turn_message`)."""
    if not isinstance(takeover, list | tuple) or not all(isinstance(turn, str | dict) for turn in takeover):
        raise ValidationError({"takeover_actions": "Give the takeover as a list of actions or assistant messages."})
    original = messages_before(trajectory, step_index)
    env = trajectory.project.environment.load()
    human = [turn_message(env, corrected), *(turn_message(env, turn) for turn in takeover)]
    task = trajectory.task.reset_spec()
    return replay_turns(env, task, original, human, offered_tools(trajectory))


def offered_tools(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The tools the agent was offered in this trajectory: its own, else its task's (an imported task's spec may not
    list them, and then the environment's task of that seed does); none for an environment without tools or a task
    it cannot rebuild."""
    if trajectory.tools:
        return list(trajectory.tools)
    try:
        task = trajectory.task.reset_spec()
    except ValidationError:
        return []
    if tools := task_tools(task):
        return tools
    env = trajectory.project.environment.load()
    return task_tools(env.make_task(task["seed"])) if "seed" in task else []


def messages_before(trajectory: Trajectory, step_index: int) -> list[Message]:
    """The trajectory's assistant messages before step `step_index` (0-based), verbatim."""
    if not 0 <= step_index < trajectory.num_steps:
        raise ValidationError(
            {"step": f"Trajectory {trajectory.pk} has no step {step_index + 1}; it has {trajectory.num_steps} steps."}
        )
    messages = list(
        Step.objects.filter(trajectory=trajectory, index__lt=step_index)
        .order_by("index")
        .values_list("message", flat=True)
    )
    if len(messages) != step_index:
        raise ValidationError({"step": f"Trajectory {trajectory.pk} is missing steps before step {step_index + 1}."})
    return messages
