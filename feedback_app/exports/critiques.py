"""The `critiques` export: generative-critic rows from annotators' critiques of a trajectory, a step or a span."""

from __future__ import annotations

from collections.abc import Iterator

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.rows import (
    ExportRow,
    first_trajectories,
    item_batches,
    label_queryset,
)
from feedback_app.models import Critique, Project
from reward_models.rows import critique_pair, critique_request, critique_row


def critique_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Generative-critic data: `prompt` asks for a critique of the trajectory (or of its last step, or a span of
    it) shown as a transcript; `completion` is the annotator's critique. Also: trajectory_id, task_id,
    step_index, span_field, span_start, span_end, span_text, tags, annotator_ids, label_ids."""
    labels = label_queryset(Critique, project, filters, ("trajectory",))
    rows = labels.order_by("trajectory_id", "id").values_list(
        "id",
        "annotator_id",
        "trajectory_id",
        "step__index",
        "span_field",
        "span_start",
        "span_end",
        "text",
        "tags",
        "step__observation",
        "step__reasoning",
        "step__action",
    )
    for batch, conversations in item_batches(rows, lambda row: row[2], first_trajectories(2)):
        for group in batch:
            conversation = conversations[group[0][2]]
            for label_id, annotator_id, _, step, field, start, end, text, tags, *step_fields in group:
                span_text = ""
                if field:
                    span_text = dict(zip(("observation", "reasoning", "action"), step_fields, strict=True))[field]
                    span_text = span_text[start:end]
                if step is not None and step >= conversation.num_steps:
                    continue
                shown = (
                    conversation.messages
                    if step is None
                    else conversation.turns(0, conversation.step_starts[step] + 1)
                )
                request = critique_request(step, field, span_text)
                prompt, completion = critique_pair(shown, request, text, filters.style)
                values = critique_row(
                    prompt,
                    completion,
                    trajectory_id=conversation.trajectory_id,
                    task_id=conversation.task_id,
                    step_index=step,
                    span_field=field,
                    span_start=start,
                    span_end=end,
                    span_text=span_text,
                    tags=list(tags),
                    annotator_ids=[annotator_id],
                    label_ids=[label_id],
                )
                yield ExportRow(values, "critique", [label_id])
