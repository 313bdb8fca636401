"""The `unpaired` export: KTO-style rows from ratings and thumbs."""

from __future__ import annotations

from collections.abc import Iterator

from feedback_app.exports.aggregate import Vote, aggregate
from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.rows import (
    ExportRow,
    first_trajectories,
    item_batches,
    label_queryset,
    provenance,
    tools_of,
)
from feedback_app.models import Project, Rating
from reward_models.rows import rating_is_desirable, styled, unpaired_row


def unpaired_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """KTO-style unpaired feedback from ratings and thumbs: `prompt` (instruction and first observation),
    `completion` (the rest of the trajectory) and `label` (desirable or not; see
    `reward_models.rows.rating_is_desirable`). Also: agreement, annotator_ids, label_ids, trajectory_id, task_id."""
    labels = label_queryset(Rating, project, filters, ("trajectory",))
    rows = labels.order_by("trajectory_id", "id").values_list(
        "id", "annotator_id", "trajectory_id", "score", "thumb_up"
    )
    for batch, conversations in item_batches(rows, lambda row: row[2], first_trajectories(2)):
        for group in batch:
            conversation = conversations[group[0][2]]
            if conversation.num_steps == 0:
                continue
            votes = []
            for label_id, annotator_id, _, score, thumb_up in group:
                desirable = rating_is_desirable(score, thumb_up)
                if desirable is not None:
                    votes.append(Vote(label_id, annotator_id, desirable))
            for verdict in aggregate(votes, filters.aggregate, filters.min_agreement):
                cut = conversation.prompt_length
                prompt, completion = styled(filters.style, conversation.turns(0, cut), conversation.turns(cut))
                label_ids, annotator_ids = provenance(verdict)
                values = unpaired_row(
                    prompt,
                    completion,
                    bool(verdict.value),
                    agreement=verdict.agreement,
                    annotator_ids=annotator_ids,
                    label_ids=label_ids,
                    trajectory_id=conversation.trajectory_id,
                    task_id=conversation.task_id,
                    tools=tools_of(conversation, filters.style),
                )
                yield ExportRow(values, "rating", label_ids)
