"""Storing validated rows: the tasks they name, and their trajectories with their steps.

Shared by the trajectory and the preference import; the SQL of the inserts is in `bulk_sql`.
"""

from __future__ import annotations

import json

from feedback_app.imports.bulk_sql import insert_steps, insert_trajectories
from feedback_app.models import Project, Task, Trajectory


def store_trajectories(trajectories: list[Trajectory], steps_of: list[list[dict]]) -> None:
    """Insert `trajectories`, then each one's validated steps; the last step of each is marked done."""
    insert_trajectories(trajectories)
    # JSON goes in as text: SQLite stores it so, and PostgreSQL's COPY parses it into jsonb.
    json_text = json.dumps
    insert_steps(
        (
            trajectory.pk,
            index,
            json_text(step["message"]),
            json_text(step["replies"]),
            step["observation"],
            step["reasoning"],
            step["action"],
            json_text(step["tool_calls"]),
            step["reward"],
            step["logprob"],
            json_text(step["media"]),
            "{}",
            step["done"] or index == len(steps) - 1,
        )
        for trajectory, steps in zip(trajectories, steps_of, strict=True)
        for index, step in enumerate(steps)
    )


def resolve_tasks(project: Project, refs: list[dict]) -> list[Task]:
    """Find or make each row's task: by external_id, else by seed, else one new task per distinct instruction."""

    def key(ref: dict) -> tuple:
        if ref.get("external_id"):
            return ("external_id", ref["external_id"])
        if ref.get("seed") is not None:
            return ("seed", ref["seed"])
        return ("instruction", ref["instruction"])

    keys = [key(ref) for ref in refs]
    found: dict[tuple, Task] = {}
    by_ext = {k[1] for k in keys if k[0] == "external_id"}
    by_seed = {k[1] for k in keys if k[0] == "seed"}
    if by_ext:
        for task in Task.objects.filter(project=project, external_id__in=by_ext):
            found[("external_id", task.external_id)] = task
    if by_seed:
        for task in Task.objects.filter(project=project, seed__in=by_seed):
            found[("seed", task.seed)] = task
    missing: dict[tuple, Task] = {}
    for k, ref in zip(keys, refs, strict=True):
        if k in found or k in missing:
            continue
        missing[k] = Task(
            project=project,
            instruction=ref.get("instruction", ""),
            seed=ref.get("seed"),
            external_id=ref.get("external_id"),
            spec=ref.get("spec") or ({"seed": ref["seed"]} if ref.get("seed") is not None else {}),
        )
    Task.objects.bulk_create(missing.values(), batch_size=1000)
    found.update(missing)
    return [found[k] for k in keys]
