"""The `stepwise` export: process-reward rows from step labels, and the step labels interventions imply."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from feedback_app.exports.aggregate import Verdict, Vote, aggregate
from feedback_app.exports.conversation import Conversation
from feedback_app.exports.filters import Aggregation, ExportFilters, Interventions, Neutral, Style
from feedback_app.exports.rows import (
    ExportRow,
    first_trajectories,
    intervention_batches,
    item_batches,
    label_queryset,
    tools_of,
)
from feedback_app.models import Project, StepLabel
from reward_models.rows import labelled_pieces, step_pieces, stepwise_row

_NEUTRAL_AS = {Neutral.DROP: None, Neutral.POSITIVE: True, Neutral.NEGATIVE: False}


def stepwise_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Process-reward data in TRL's stepwise layout: `prompt` (instruction and first observation, as text),
    `completions` (one text piece per labelled step) and `labels` (True for a good step).

    Neutral labels are mapped or dropped (`filters.neutral`) before aggregation. A step left without a label (none
    given, dropped, a tied vote, too little agreement) stays in the text as context: it is merged into the next
    labelled step's piece, so every piece ends at a labelled decision and the prompt followed by the pieces is the
    transcript up to the last labelled step. Also: step_indices (the step each label judges), agreement (the lowest
    of the row's steps), annotator_ids, label_ids, trajectory_id, task_id, and source ("label"). With
    `aggregate=all`, one row per annotator and trajectory.

    With `interventions=include` (the default) the step-label rows are followed by one row per current intervention
    (`source` "intervention", see `intervention_step_rows`). The two never merge, even on the same trajectory: an
    intervention implies labels only up to the step it corrects, from one annotator, and a trainer may want to
    weigh or drop them apart from labels people gave step by step.
    """
    yield from _step_label_rows(project, filters)
    if filters.interventions == Interventions.INCLUDE:
        yield from intervention_step_rows(project, filters)


def _step_label_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    labels = label_queryset(StepLabel, project, filters, ("step__trajectory",))
    rows = labels.order_by("step__trajectory_id", "step__index", "id").values_list(
        "id", "annotator_id", "value", "step__trajectory_id", "step__index"
    )
    neutral = _NEUTRAL_AS[filters.neutral]
    for batch, conversations in item_batches(rows, lambda row: row[3], first_trajectories(3)):
        for group in batch:
            votes_by_step: dict[int, list[Vote]] = defaultdict(list)
            for label_id, annotator_id, value, _, step in group:
                good = neutral if value == 0 else value > 0
                if good is not None:
                    votes_by_step[step].append(Vote(label_id, annotator_id, good))
            rows_by_key: dict[int, dict[int, Verdict]] = defaultdict(dict)
            for step, votes in votes_by_step.items():
                for verdict in aggregate(votes, filters.aggregate, filters.min_agreement):
                    key = verdict.supporting[0].annotator_id if filters.aggregate == Aggregation.ALL else 0
                    rows_by_key[key][step] = verdict
            conversation = conversations[group[0][3]]
            for key in sorted(rows_by_key):
                row = _stepwise_row(conversation, rows_by_key[key], filters.style)
                if row is not None:
                    yield row


def _stepwise_row(conversation: Conversation, verdicts: dict[int, Verdict], style: Style) -> ExportRow | None:
    steps = sorted(step for step in verdicts if step < conversation.num_steps)
    if not steps:
        return None
    prompt, pieces = step_pieces(conversation, style)
    considered = [vote for step in steps for vote in verdicts[step].considered]
    label_ids = sorted(vote.label_id for vote in considered)
    values = stepwise_row(
        prompt,
        labelled_pieces(pieces, steps, style),
        [bool(verdicts[step].value) for step in steps],
        step_indices=steps,
        agreement=min(verdicts[step].agreement for step in steps),
        annotator_ids=sorted({vote.annotator_id for vote in considered}),
        label_ids=label_ids,
        trajectory_id=conversation.trajectory_id,
        task_id=conversation.task_id,
        source="label",
        tools=tools_of(conversation, style),
    )
    return ExportRow(values, "step_label", label_ids)


def intervention_step_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Step labels that interventions imply, as in RLIF: the annotator let every step before the intervened one
    stand (accepted, True) and replaced the intervened one (rejected, False). One row per current intervention,
    with the stepwise columns: the pieces of steps 0..k of the intervened trajectory (which holds the original step
    k), agreement 1.0, the intervention's annotator and id, and source "intervention". An intervention whose
    correction is the original decision again rejected nothing and gives no row."""
    for batch, conversations in intervention_batches(project, filters, "original_message", "corrected_message"):
        for group in batch:
            conversation = conversations.get(group[0][2])
            if conversation is None:  # deleted while the export ran
                continue
            prompt, pieces = step_pieces(conversation, filters.style)
            for label_id, annotator_id, _, step, original, corrected in group:
                if conversation.num_steps <= step or original == corrected:
                    continue
                values = stepwise_row(
                    prompt,
                    pieces[: step + 1],
                    [True] * step + [False],
                    step_indices=list(range(step + 1)),
                    agreement=1.0,
                    annotator_ids=[annotator_id],
                    label_ids=[label_id],
                    trajectory_id=conversation.trajectory_id,
                    task_id=conversation.task_id,
                    source="intervention",
                    tools=tools_of(conversation, filters.style),
                )
                yield ExportRow(values, "intervention", [label_id])
