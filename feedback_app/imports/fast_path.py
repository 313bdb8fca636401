"""The fast path for trajectory rows: plain rows checked without DRF.

DRF validates a five-step row in about 2 ms, which makes it most of the cost of a large import. Most rows are plain:
exact JSON types, no surrounding whitespace, no media. `plain_trajectory_row` accepts exactly those and returns what
TrajectoryImportSerializer would; for anything else it returns None and the serializer decides (and words the
errors). The serializer stays the definition of the schema; tests check the two agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings

from feedback_app.trajectory_schema import trajectory_size_problem, turns_for_steps

_ODD_CHARACTERS = re.compile("[\x00\ud800-\udfff]")  # DRF refuses null characters and lone surrogates


def _text(value: Any, *, blank: bool, trim: bool, max_length: int | None = None) -> bool:
    if type(value) is not str or (not blank and value == "") or (trim and value != value.strip()):
        return False
    if max_length is not None and len(value) > max_length:
        return False
    return "\x00" not in value if value.isascii() else not _ODD_CHARACTERS.search(value)


def _number(value: Any) -> bool:
    return (type(value) is float and math.isfinite(value)) or (type(value) is int and abs(value) < 2**53)


def _plain_tool_call(call: Any) -> dict | None:
    if type(call) is not dict or not call.keys() <= {"id", "type", "name", "arguments", "function"}:
        return None
    out: dict[str, Any] = {}
    if "id" in call:
        if not _text(call["id"], blank=True, trim=True):
            return None
        out["id"] = call["id"]
    out["type"] = call.get("type", "function")
    if not _text(out["type"], blank=False, trim=True):
        return None
    if "name" in call:
        if not _text(call["name"], blank=False, trim=True):
            return None
        out["name"] = call["name"]
    out["arguments"] = call.get("arguments", {})
    if out["arguments"] is None:
        return None
    if "function" in call:
        function = call["function"]
        if type(function) is not dict or "name" not in function:
            return None
        out.setdefault("name", function["name"])
        out["arguments"] = function.get("arguments", out["arguments"])
    if not out.get("name"):
        return None
    return out


def _all_plain(items: list, plain: Callable[[Any], dict | None]) -> list[dict] | None:
    """`plain` of each item, or None as soon as one item is not plain."""
    out = []
    for item in items:
        if (value := plain(item)) is None:
            return None
        out.append(value)
    return out


def _plain_step(step: Any) -> dict | None:
    if type(step) is not dict or step.get("media"):
        return None
    out: dict[str, Any] = {}
    for name in ("observation", "reasoning", "action"):
        value = step.get(name, "")
        if not _text(value, blank=True, trim=False):
            return None
        out[name] = value
    calls = step.get("tool_calls", [])
    if type(calls) is not list:
        return None
    out["tool_calls"] = _all_plain(calls, _plain_tool_call)
    if out["tool_calls"] is None:
        return None
    reward, logprob, done = step.get("reward", 0.0), step.get("logprob"), step.get("done", False)
    if not _number(reward) or not (logprob is None or _number(logprob)) or type(done) is not bool:
        return None
    if not out["action"] and not out["tool_calls"]:
        return None
    out.update(reward=float(reward), logprob=None if logprob is None else float(logprob), media=[], done=done)
    return out


def plain_trajectory_row(row: dict) -> dict | None:
    """TrajectoryImportSerializer's validated data for a plain step-based row, or None to let it decide."""
    if "messages" in row:
        return None
    external_id, task, steps = row.get("external_id"), row.get("task"), row.get("steps")
    if not _text(external_id, blank=False, trim=True, max_length=255) or type(task) is not dict:
        return None
    if type(steps) is not list or not steps or len(steps) > settings.TANDEM_MAX_TRAJECTORY_STEPS:
        return None
    out_task: dict[str, Any] = {}
    if "external_id" in task:
        if not _text(task["external_id"], blank=False, trim=True, max_length=255):
            return None
        out_task["external_id"] = task["external_id"]
    if "seed" in task:
        if not (task["seed"] is None or type(task["seed"]) is int):
            return None
        out_task["seed"] = task["seed"]
    out_task["instruction"] = task.get("instruction", "")
    if not _text(out_task["instruction"], blank=True, trim=True):
        return None
    out_task["spec"] = task.get("spec", {})
    if type(out_task["spec"]) is not dict:
        return None
    out_task["spec"] = dict(out_task["spec"])
    if not out_task.get("external_id") and out_task.get("seed") is None and not out_task["instruction"]:
        return None
    out: dict[str, Any] = {"external_id": external_id, "task": out_task}
    if "policy" in row:
        if not _text(row["policy"], blank=False, trim=True, max_length=120):
            return None
        out["policy"] = row["policy"]
    out["source"] = row.get("source", "import")
    if out["source"] not in ("import", "human"):
        return None
    out["steps"] = _all_plain(steps, _plain_step)
    if out["steps"] is None:
        return None
    if "outcome" in row:
        outcome = row["outcome"]
        if type(outcome) is not dict:
            return None
        success, outcome_return = outcome.get("success"), outcome.get("return")
        if not (success is None or type(success) is bool) or not (outcome_return is None or _number(outcome_return)):
            return None
        out["outcome"] = {
            "success": success,
            "outcome_return": None if outcome_return is None else float(outcome_return),
        }
    metadata = row.get("metadata", {})
    if type(metadata) is not dict:
        return None
    out["metadata"] = dict(metadata)
    if "tools" in row:
        return None  # the serializer checks them
    out["tools"] = []
    if trajectory_size_problem(out["steps"]):
        return None  # the serializer words the error
    out["prompt"] = turns_for_steps(out["task"]["instruction"], out["steps"])
    return out
