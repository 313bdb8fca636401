"""The `raw` export: every label of every kind, every revision, with who, when, how long, in which order it was
shown and whether it was a gold item, for analysis (pandas, DuckDB) rather than training.

One row per stored revision. `first_revision_id` is the same for all revisions of one label, so
`groupby("first_revision_id")` gives each label's history; `is_current` marks the revision that counts.
Columns that do not apply to a label's kind are null.
"""

from __future__ import annotations

import json

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.rows import CHUNK_ROWS, ExportRow, label_queryset
from feedback_app.models import Comparison, Critique, Intervention, LabelKind, Project, Rating, StepLabel

COMMON_PATHS = {
    "label_id": "id",
    "revision": "revision",
    "supersedes_id": "supersedes_id",
    "is_current": "is_current",
    "annotator_id": "annotator_id",
    "annotator": "annotator__username",
    "created_at": "created_at",
    "seconds_spent": "seconds_spent",
    "query_strategy": "query_strategy",
    "assignment_id": "assignment_id",
    "queue_item_id": "assignment__item_id",
    "is_gold": "assignment__item__is_gold",
    "gold_answer": "assignment__item__gold_answer",
}
# Per kind: the model, the paths to the trajectories it judges (for the policy-version filter), and its columns.
KIND_SOURCES = (
    (
        LabelKind.COMPARISON,
        Comparison,
        ("trajectory_a", "trajectory_b"),
        {
            "trajectory_id": "trajectory_a_id",
            "other_trajectory_id": "trajectory_b_id",
            "displayed_order": "displayed_order",
            "choice": "choice",
            "strength": "strength",
            "rationale": "rationale",
        },
    ),
    (
        LabelKind.STEP_LABEL,
        StepLabel,
        ("step__trajectory",),
        {"trajectory_id": "step__trajectory_id", "step_index": "step__index", "value": "value"},
    ),
    (
        LabelKind.CRITIQUE,
        Critique,
        ("trajectory",),
        {
            "trajectory_id": "trajectory_id",
            "step_index": "step__index",
            "span_field": "span_field",
            "span_start": "span_start",
            "span_end": "span_end",
            "text": "text",
            "tags": "tags",
        },
    ),
    (
        LabelKind.RATING,
        Rating,
        ("trajectory",),
        {"trajectory_id": "trajectory_id", "score": "score", "thumb_up": "thumb_up", "comment": "comment"},
    ),
    (
        LabelKind.INTERVENTION,
        Intervention,
        ("trajectory",),
        {
            "trajectory_id": "trajectory_id",
            "step_index": "step__index",
            "original_message": "original_message",
            "corrected_message": "corrected_message",
            "original_reasoning": "original_reasoning",
            "original_action": "original_action",
            "corrected_reasoning": "corrected_reasoning",
            "corrected_action": "corrected_action",
            "takeover_actions": "takeover_actions",
            "reason": "reason",
            "child_trajectory_id": "child_trajectory_id",
        },
    ),
)
KIND_COLUMNS = [column for _, _, _, paths in KIND_SOURCES for column in paths]
RAW_COLUMNS = [
    "label_kind",
    *COMMON_PATHS,
    "first_revision_id",
    *dict.fromkeys(KIND_COLUMNS),
]


def raw_rows(project: Project, filters: ExportFilters):
    """Every revision of every label kind, kind by kind, in id order (see the module docstring)."""
    empty = dict.fromkeys(RAW_COLUMNS)
    for kind, model, trajectory_paths, paths in KIND_SOURCES:
        labels = label_queryset(model, project, filters, trajectory_paths, current=False)
        # Only revisions after the first have a predecessor, and they are few: keep that map, unfiltered, so a
        # chain's root is found even when the date filter leaves its earlier revisions out.
        predecessor = dict(
            model.objects.filter(project=project, supersedes__isnull=False).values_list("id", "supersedes_id")
        )
        names = [*COMMON_PATHS, *paths]
        rows = labels.order_by("id").values_list(*COMMON_PATHS.values(), *paths.values())
        for values in rows.iterator(chunk_size=CHUNK_ROWS):
            row = {**empty, "label_kind": kind.value, **dict(zip(names, values, strict=True))}
            root = row["label_id"]
            while root in predecessor:
                root = predecessor[root]
            row["first_revision_id"] = root
            row["is_gold"] = bool(row["is_gold"])
            if row["gold_answer"] is not None:
                row["gold_answer"] = json.dumps(row["gold_answer"], sort_keys=True)
            for name in ("original_message", "corrected_message"):
                if row[name] is not None:
                    row[name] = json.dumps(row[name], ensure_ascii=False)
            if row["takeover_actions"] is not None:
                # A takeover turn is an action or an assistant message; one column type holds both as text.
                row["takeover_actions"] = [
                    turn if isinstance(turn, str) else json.dumps(turn, ensure_ascii=False)
                    for turn in row["takeover_actions"]
                ]
            yield ExportRow(row, kind.value, [row["label_id"]])
