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

import json
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ValidationError

from feedback_app.models import Step, Task, Trajectory
from reward_models.conversation import Message, message_tool_calls
from reward_models.envs import Environment, StepResult, replay
from reward_models.envs.base import message_action, task_tools
from reward_models.tool_schemas import schema_errors


class NotReplayable(ValidationError):
    """The environment cannot rebuild this trajectory's episode: it can be labelled and critiqued, not continued."""


def task_spec(task: Task) -> dict[str, Any]:
    """The task dict the environment's reset() takes: the stored spec, with the task's seed and instruction where
    the spec leaves them out (policies read the instruction from it)."""
    if not task.spec and task.seed is None:
        raise NotReplayable(
            {
                "trajectory": "This trajectory was imported without its task's seed or spec, so the environment "
                "cannot replay it and it cannot be continued. You can still label its steps and critique it."
            }
        )
    defaults: dict[str, Any] = {"instruction": task.instruction}
    if task.seed is not None:
        defaults["seed"] = task.seed
    return {**defaults, **task.spec}


def is_replayable(task: Task) -> bool:
    return bool(task.spec) or task.seed is not None


def turn_message(env: Environment, turn: Message | str, reasoning: str = "") -> Message:
    """An annotator's turn as an assistant message: a message as it is, or an action picked from the legal ones
    written the way the environment's agents write it (``message_for_action``; the gridworld's ``reasoning ; action
    move``), or else as the message's text."""
    if isinstance(turn, dict):
        return turn
    write = getattr(env, "message_for_action", None)
    if write is not None:
        return write(turn, reasoning)
    return {"role": "assistant", "content": f"{reasoning}\n{turn}" if reasoning else turn}


def tool_call_errors(message: Message, tools: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Why each tool call of an annotator's message cannot be sent, keyed ``tool_calls.<i>.name`` or
    ``tool_calls.<i>.arguments[.<field>]``: the tool must be one of the task's, its arguments a JSON object matching
    the tool's schema."""
    schemas = {
        tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in tools if "function" in tool
    }
    errors: dict[str, str] = {}
    for index, call in enumerate(message_tool_calls(message)):
        function = call.get("function", call)
        name = function.get("name") or ""
        if name not in schemas:
            known = ", ".join(schemas) or "none"
            errors[f"tool_calls.{index}.name"] = f"{name!r} is not one of this task's tools ({known})"
            continue
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                errors[f"tool_calls.{index}.arguments"] = (
                    f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
                )
                continue
        if not isinstance(arguments, dict):
            errors[f"tool_calls.{index}.arguments"] = "must be a JSON object"
            continue
        for path, reason in schema_errors(arguments, schemas[name]):
            errors[f"tool_calls.{index}.arguments" + (f".{path}" if path else "")] = reason
    return errors


def replay_correction(
    env: Environment,
    task: dict[str, Any],
    original: Sequence[Message],
    corrected: Message,
    takeover: Sequence[Message] = (),
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[StepResult]:
    """Replay the `original` turns (the steps before the intervention), then the annotator's corrected turn and
    takeover turns, checking each of the annotator's against the environment and against `tools` (by default the
    task's). Returns one result per turn.

    Raises ValidationError keyed ``step``, ``corrected_action``, ``takeover_actions`` or ``tool_calls...``.
    """
    branch = len(original)
    results = _replay_original(env, task, original)
    human = [corrected, *takeover]
    tools = task_tools(task) if tools is None else tools
    for offset, message in enumerate(human):
        field = "corrected_action" if offset == 0 else "takeover_actions"
        where = "" if offset == 0 else f"step {branch + offset + 1}: "
        if not (message.get("content") or "").strip() and not message_tool_calls(message):
            raise ValidationError({field: f"{where}write a turn: a tool call or some text."})
        if tools:
            errors = tool_call_errors(message, tools)
            if errors:
                raise ValidationError({key: f"{where}{reason}" for key, reason in errors.items()})
        action = message_action(env, message)
        legal = env.legal_actions()
        if legal and action not in legal:
            raise ValidationError({field: f"{where}{action!r} is not a legal action; legal: {', '.join(legal)}"})
        results.append(env.step(action))
        remaining = len(human) - offset - 1
        if results[-1].done and remaining:
            raise ValidationError(
                {
                    "takeover_actions": f"The episode ends at step {branch + offset + 1}, so the {remaining} "
                    f"takeover turn{'s' if remaining > 1 else ''} after it cannot be played."
                }
            )
    return results


def legal_actions_at(trajectory: Trajectory, step_index: int) -> list[str]:
    """The environment's legal actions in the state before step `step_index` (0-based) of `trajectory` (none for an
    open action space)."""
    original = messages_before(trajectory, step_index)
    env = trajectory.project.environment.load()
    _replay_original(env, task_spec(trajectory.task), original)
    return env.legal_actions()


def validate_correction(
    trajectory: Trajectory, step_index: int, corrected: Message | str, takeover: Sequence[Message | str] = ()
) -> list[StepResult]:
    """Raise ValidationError (keyed as `replay_correction`'s) unless the annotator's turns at `step_index` (0-based)
    and after it can be played in the environment; else the environment's results, one per turn. A turn is an
    assistant message or an action picked from the legal ones (`turn_message`)."""
    if not isinstance(takeover, list | tuple) or not all(isinstance(turn, str | dict) for turn in takeover):
        raise ValidationError({"takeover_actions": "Give the takeover as a list of actions or assistant messages."})
    original = messages_before(trajectory, step_index)
    env = trajectory.project.environment.load()
    human = [turn_message(env, corrected), *(turn_message(env, turn) for turn in takeover)]
    task = task_spec(trajectory.task)
    return replay_correction(env, task, original, human[0], human[1:], offered_tools(trajectory))


def offered_tools(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The tools the agent was offered in this trajectory: its own, else its task's (an imported task's spec may not
    list them, and then the environment's task of that seed does); none for an environment without tools or a task
    it cannot rebuild."""
    if trajectory.tools:
        return list(trajectory.tools)
    try:
        task = task_spec(trajectory.task)
    except ValidationError:
        return []
    if tools := task_tools(task):
        return tools
    env = trajectory.project.environment.load()
    return task_tools(env.make_task(task["seed"])) if "seed" in task else []


def _replay_original(env: Environment, task: dict[str, Any], original: Sequence[Message]) -> list[StepResult]:
    """Replay the trajectory's own turns before the intervention, as the agent played them."""
    branch = len(original)
    try:
        _, results = replay(env, task, [message_action(env, message) for message in original], strict=False)
    except ValueError as exc:
        raise ValidationError({"step": f"The episode cannot be replayed up to step {branch + 1}: {exc}"}) from exc
    if results and results[-1].done:
        raise ValidationError({"step": f"The episode had already ended before step {branch + 1}."})
    return results


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
