"""The `step_preference` export: pairs of continuations at a shared prefix, from interventions (the correction over
the original step) and from comparisons of two branches of one tree."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import F, Q

from feedback_app.exports.filters import ExportFilters, Ties
from feedback_app.exports.preference import comparison_judgement, comparison_verdicts
from feedback_app.exports.rows import (
    ExportRow,
    intervention_batches,
    label_queryset,
    tools_of,
)
from feedback_app.models import Comparison, Project
from reward_models.rows import (
    INTERVENTION_MARGIN,
    pair_row,
    shared_steps,
    split_pair,
    step_preference_columns,
    styled,
)


def step_preference_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Pairs of continuations at a shared prefix. From interventions: the corrected decision is chosen over the
    original at the intervened step. From comparisons of two branches of one tree (parent and child, or siblings):
    the preferred branch's continuation from the step where they part, over the other's. Columns: prompt, chosen,
    rejected, margin, agreement, rationale, annotator_ids, label_ids, source, step_index, task_id,
    chosen_trajectory_id, rejected_trajectory_id (None for a correction not yet continued), and with `ties=include`
    tie (true for a tie between two branches, in canonical order with margin 0; false for every other row)."""
    yield from _intervention_pairs(project, filters)
    yield from _branch_comparison_pairs(project, filters)


def _intervention_pairs(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    ties = filters.ties == Ties.INCLUDE
    columns = ("original_message", "corrected_message", "reason", "child_trajectory_id")
    for batch, conversations in intervention_batches(project, filters, *columns):
        for group in batch:
            conversation = conversations[group[0][2]]
            for label_id, annotator_id, _, step, original, corrected, reason, child_id in group:
                if original == corrected or conversation.num_steps <= step:
                    continue
                prompt, chosen, rejected = styled(
                    filters.style, conversation.turns(0, conversation.before_step(step)), [corrected], [original]
                )
                columns = step_preference_columns(
                    margin=INTERVENTION_MARGIN,
                    agreement=1.0,
                    rationale=reason,
                    annotator_ids=[annotator_id],
                    label_ids=[label_id],
                    source="intervention",
                    step_index=step,
                    task_id=conversation.task_id,
                    chosen_trajectory_id=child_id,
                    rejected_trajectory_id=conversation.trajectory_id,
                    tools=tools_of(conversation, filters.style),
                    tie=False if ties else None,
                )
                yield ExportRow(pair_row(prompt, chosen, rejected, columns), "intervention", [label_id])


def _branch_comparison_pairs(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    labels = label_queryset(Comparison, project, filters, ("trajectory_a", "trajectory_b")).filter(
        Q(trajectory_a__parent_id=F("trajectory_b_id"))
        | Q(trajectory_b__parent_id=F("trajectory_a_id"))
        | Q(trajectory_a__parent_id=F("trajectory_b__parent_id"))
    )
    for chosen, rejected, verdict in comparison_verdicts(labels, filters):
        step = shared_steps(chosen, rejected)
        if not step:  # None or 0: no shared step, so this is a whole-trajectory preference
            continue
        judgement = comparison_judgement(verdict)
        columns = step_preference_columns(
            **judgement,
            source="comparison",
            step_index=step,
            task_id=chosen.task_id,
            chosen_trajectory_id=chosen.trajectory_id,
            rejected_trajectory_id=rejected.trajectory_id,
            tools=tools_of(chosen, filters.style),
            tie=verdict.value == "tie" if filters.ties == Ties.INCLUDE else None,
        )
        parts = split_pair(chosen.messages, rejected.messages, chosen.before_step(step), filters.style)
        yield ExportRow(pair_row(*parts, columns), "comparison", judgement["label_ids"])
