"""Replaying an annotator's correction in the environment: the trajectory's own turns before the intervened step,
then the annotator's corrected turn and any takeover turns, each checked against the environment's legal actions and
the task's tools.

The web request checks a correction with this before storing it (`feedback_app.corrections`), and the worker replays
it again before the policy plays on (`training.interventions`). `CorrectionError` keys each reason by the field of
the intervention it concerns, as the forms and the API show it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reward_models.conversation import Message, message_tool_calls
from reward_models.envs.base import Environment, StepResult, message_action, replay, task_tools
from reward_models.tool_schemas import schema_errors


class CorrectionError(ValueError):
    """A correction that cannot be played; `errors` maps a field (``step``, ``corrected_action``,
    ``takeover_actions`` or ``tool_calls...``) to the reason."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{field}: {reason}" for field, reason in errors.items()))
        self.errors = errors


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

    Raises CorrectionError keyed ``step``, ``corrected_action``, ``takeover_actions`` or ``tool_calls...``.
    """
    branch = len(original)
    results = replay_original(env, task, original)
    human = [corrected, *takeover]
    tools = task_tools(task) if tools is None else tools
    for offset, message in enumerate(human):
        field = "corrected_action" if offset == 0 else "takeover_actions"
        where = "" if offset == 0 else f"step {branch + offset + 1}: "
        if not (message.get("content") or "").strip() and not message_tool_calls(message):
            raise CorrectionError({field: f"{where}write a turn: a tool call or some text."})
        if tools:
            errors = tool_call_errors(message, tools)
            if errors:
                raise CorrectionError({key: f"{where}{reason}" for key, reason in errors.items()})
        action = message_action(env, message)
        legal = env.legal_actions()
        if legal and action not in legal:
            raise CorrectionError({field: f"{where}{action!r} is not a legal action; legal: {', '.join(legal)}"})
        results.append(env.step(action))
        remaining = len(human) - offset - 1
        if results[-1].done and remaining:
            raise CorrectionError(
                {
                    "takeover_actions": f"The episode ends at step {branch + offset + 1}, so the {remaining} "
                    f"takeover turn{'s' if remaining > 1 else ''} after it cannot be played."
                }
            )
    return results


def replay_original(env: Environment, task: dict[str, Any], original: Sequence[Message]) -> list[StepResult]:
    """Replay the trajectory's own turns before the intervention, as the agent played them."""
    branch = len(original)
    try:
        _, results = replay(env, task, [message_action(env, message) for message in original], strict=False)
    except ValueError as exc:
        raise CorrectionError({"step": f"The episode cannot be replayed up to step {branch + 1}: {exc}"}) from exc
    if results and results[-1].done:
        raise CorrectionError({"step": f"The episode had already ended before step {branch + 1}."})
    return results
