"""Importing trajectories: how a trajectory row is validated and stored, the streaming import of an API body, and
the two steps (validate every row, then store) of the management command's import.

`external_id` makes a retried import idempotent: rows already stored are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from django.db import transaction

from feedback_app.imports.batches import BATCH_ROWS, import_rows
from feedback_app.imports.fast_path import plain_trajectory_row
from feedback_app.imports.results import MAX_REPORTED_ERRORS, ImportRejected, ImportResult, RowError
from feedback_app.imports.storing import resolve_tasks, store_trajectories
from feedback_app.imports.validation import RowKind
from feedback_app.models import PolicyVersion, Project, Trajectory
from feedback_app.models.trajectories import PolicyKind
from feedback_app.trajectory_schema import TrajectoryImportSerializer


class TrajectoryRows(RowKind):
    serializer_class = TrajectoryImportSerializer

    def fast(self, obj: dict) -> dict | None:
        return plain_trajectory_row(obj)

    def __init__(self, project: Project) -> None:
        super().__init__(project)
        self.policies: dict[str, PolicyVersion] = {}

    def store(self, rows: list[dict], result: ImportResult) -> None:
        existing = set(
            Trajectory.objects.filter(project=self.project, external_id__in=[r["external_id"] for r in rows])
            .values_list("external_id", flat=True)
            .order_by()
        )
        new_rows = [row for row in rows if row["external_id"] not in existing]
        result.skipped_existing += len(rows) - len(new_rows)
        if not new_rows:
            return
        tasks = resolve_tasks(self.project, [row["task"] for row in new_rows])
        self._resolve_policies(new_rows)
        trajectories = [
            Trajectory(
                project=self.project,
                task=task,
                policy_version=self.policies.get(row.get("policy")),
                source=row["source"],
                external_id=row["external_id"],
                num_steps=len(row["steps"]),
                total_env_reward=sum(step["reward"] for step in row["steps"]),
                success=(row.get("outcome") or {}).get("success"),
                outcome_return=(row.get("outcome") or {}).get("outcome_return"),
                metadata=row["metadata"],
                prompt=row["prompt"],
                tools=row["tools"],
            )
            for row, task in zip(new_rows, tasks, strict=True)
        ]
        store_trajectories(trajectories, [row["steps"] for row in new_rows])
        result.created += len(trajectories)
        result.trajectory_ids.extend(t.pk for t in trajectories)

    def _resolve_policies(self, rows: list[dict]) -> None:
        names = {row["policy"] for row in rows if row.get("policy")} - set(self.policies)
        if not names:
            return
        self.policies.update(
            (policy.name, policy) for policy in PolicyVersion.objects.filter(project=self.project, name__in=names)
        )
        for name in names - set(self.policies):
            self.policies[name] = PolicyVersion.objects.create(
                project=self.project, name=name, kind=PolicyKind.EXTERNAL
            )


def import_trajectory_stream(project: Project, rows: Iterable[tuple[int, Any]]) -> ImportResult:
    """Validate and store trajectory rows (from `iter_json_rows`) atomically, streaming."""
    return import_rows(TrajectoryRows(project), rows)


# The command-line import reads the whole file first; these two keep its interface.


def validate_rows(rows: Iterable[tuple[int, Any]]) -> list[dict]:
    """Validate every row; raise ImportRejected listing the first MAX_REPORTED_ERRORS problems if any is bad."""
    kind = TrajectoryRows(project=None)
    valid: list[dict] = []
    errors: list[RowError] = []
    bad = 0
    iterator = iter(rows)
    while batch := list(islice(iterator, BATCH_ROWS)):
        batch_valid, batch_errors, batch_bad = kind.validate(batch)
        valid.extend(batch_valid)
        errors.extend(batch_errors)
        bad += batch_bad
    if bad:
        raise ImportRejected(errors[:MAX_REPORTED_ERRORS], bad)
    return valid


def import_trajectories(project: Project, rows: list[dict]) -> ImportResult:
    """Write validated rows (from `validate_rows`) atomically. Rows whose external_id exists are skipped."""
    result = ImportResult()
    kind = TrajectoryRows(project)
    with transaction.atomic():
        for start in range(0, len(rows), BATCH_ROWS):
            kind.store(rows[start : start + BATCH_ROWS], result)
    return result
