"""Importing preference labels: rows of {prompt, chosen, rejected}, each stored as a task, two trajectories and a
comparison, streamed and atomic like the trajectory import."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model

from feedback_app.imports.batches import import_rows
from feedback_app.imports.results import ImportResult
from feedback_app.imports.storing import resolve_tasks, store_trajectories
from feedback_app.imports.validation import RowKind
from feedback_app.models import Comparison, Project, Trajectory
from feedback_app.models.trajectories import TrajectorySource
from feedback_app.trajectory_schema import PreferenceImportSerializer


class PreferenceRows(RowKind):
    """Rows of {prompt, chosen, rejected} (strings, or chat messages as in TRL's conversational format).

    Each prompt becomes one Task (the same prompt text finds the same task), each answer an imported Trajectory,
    and each row a Comparison by the importing user, or by the project member the row names.
    """

    serializer_class = PreferenceImportSerializer

    def __init__(self, project: Project, user) -> None:
        super().__init__(project)
        self.user = user
        self.seen_derived: set[str] = set()
        self.members = {
            username: pk
            for username, pk in get_user_model()
            .objects.filter(memberships__project=project)
            .values_list("username", "pk")
        }

    def context(self) -> dict:
        return {"members": self.members}

    def store(self, rows: list[dict], result: ImportResult) -> None:
        for row in rows:
            row["base_id"] = row.get("external_id") or _derived_id(row)
        # A derived id repeats only for the very same judgement: store it once.
        unique: dict[str, dict] = {}
        for row in rows:
            if row["base_id"] in unique or row["base_id"] in self.seen_derived:
                result.skipped_existing += 1
            else:
                unique[row["base_id"]] = row
        self.seen_derived.update(unique)
        existing = set(
            Trajectory.objects.filter(project=self.project, external_id__in=[f"{b}:chosen" for b in unique])
            .values_list("external_id", flat=True)
            .order_by()
        )
        new_rows = [row for base, row in unique.items() if f"{base}:chosen" not in existing]
        result.skipped_existing += len(unique) - len(new_rows)
        if not new_rows:
            return
        tasks = resolve_tasks(self.project, [row["task"] for row in new_rows])
        trajectories, steps_of = [], []
        for row, task in zip(new_rows, tasks, strict=True):
            for side in ("chosen", "rejected"):
                metadata = dict(row["metadata"])
                if row.get("margin") is not None:
                    metadata["preference_margin"] = row["margin"]
                trajectories.append(
                    Trajectory(
                        project=self.project,
                        task=task,
                        source=TrajectorySource.IMPORT,
                        external_id=f"{row['base_id']}:{side}",
                        num_steps=len(row[f"{side}_steps"]),
                        metadata=metadata,
                        prompt=row[f"{side}_prompt"],
                    )
                )
                steps_of.append(row[f"{side}_steps"])
        store_trajectories(trajectories, steps_of)
        comparisons = []
        for row, chosen, rejected in zip(new_rows, trajectories[::2], trajectories[1::2], strict=True):
            first, second = sorted((chosen, rejected), key=lambda t: t.pk)
            comparisons.append(
                Comparison(
                    project=self.project,
                    annotator_id=self.members[row["annotator"]] if row.get("annotator") else self.user.pk,
                    trajectory_a=first,
                    trajectory_b=second,
                    choice="a" if first is chosen else "b",
                    strength=row["strength"],
                    rationale=row["rationale"],
                    query_strategy="import",
                )
            )
        Comparison.objects.bulk_create(comparisons, batch_size=1000)
        result.created += len(comparisons)
        result.trajectory_ids.extend(t.pk for t in trajectories)


def _derived_id(row: dict) -> str:
    content = json.dumps(
        [row["prompt"], row["chosen"], row["rejected"], row.get("annotator") or ""], sort_keys=True, default=str
    )
    return "pref-" + hashlib.sha256(content.encode()).hexdigest()[:40]


def import_preference_stream(project: Project, user, rows: Iterable[tuple[int, Any]]) -> ImportResult:
    """Validate and store preference rows (from `iter_json_rows`) atomically, streaming; `created` counts the
    comparisons."""
    return import_rows(PreferenceRows(project, user), rows)
