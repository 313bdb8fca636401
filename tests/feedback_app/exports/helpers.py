"""Small helpers shared by the export tests."""

from __future__ import annotations

from feedback_app.exports import ExportFilters, ExportKind, export_rows
from reward_models.policy.turns import format_decision


def rows(project, kind: str, **query) -> list[dict]:
    """The values of every row of an export, with filters given as query-string values."""
    return [row.values for row in export_rows(project, ExportKind(kind), ExportFilters.from_query(query))]


def steps_of(trajectory) -> list:
    return list(trajectory.steps.order_by("index"))


def decision(step) -> dict:
    return {"role": "assistant", "content": format_decision(step.reasoning, step.action)}


def observation(step) -> dict:
    return {"role": "user", "content": step.observation}


def turns_from(trajectory, first_step: int) -> list[dict]:
    """The expected chat turns of a trajectory from step `first_step` on, when the prompt ends at its observation:
    decision, next observation, decision, ..., decision."""
    steps = steps_of(trajectory)
    messages = [decision(steps[first_step])]
    for step in steps[first_step + 1 :]:
        messages += [observation(step), decision(step)]
    return messages


def prompt_until(trajectory, step_index: int) -> list[dict]:
    """System message, then every turn up to and including the observation of step `step_index`."""
    steps = steps_of(trajectory)
    messages = [{"role": "system", "content": trajectory.task.instruction}]
    for step in steps[:step_index]:
        messages += [observation(step), decision(step)]
    return [*messages, observation(steps[step_index])]


def as_in_jsonl(value):
    """Parquet rows as their JSONL lines read: the message fields a message lacks are nulls in Parquet, and the tools
    are JSON text there (`feedback_app/exports/schemas.py`)."""
    import json

    if isinstance(value, dict):
        if "role" in value:
            return {key: as_in_jsonl(item) for key, item in value.items() if item is not None}
        return {key: json.loads(item) if key == "tools" else as_in_jsonl(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_in_jsonl(item) for item in value]
    return value
