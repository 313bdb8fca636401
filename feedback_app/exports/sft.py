"""The `sft` export: conversations to imitate, from interventions, takeovers and demonstrations."""

from __future__ import annotations

from collections.abc import Iterator

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.rows import (
    ExportRow,
    first_trajectories,
    intervention_batches,
    item_batches,
    trajectory_queryset,
)
from feedback_app.models import Project
from feedback_app.models.trajectories import TrajectorySource
from reward_models.rows import sft_row


def sft_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Conversations to imitate, as `messages`: interventions (the prefix and the corrected decision), takeovers
    (the corrected decision and the steps the annotator then played by hand, with the observations that followed;
    without the policy's own continuation after them) and demonstrations (whole trajectories played by a person).
    Also: source (intervention, takeover or demonstration), step_index (where the person took over), annotator_ids,
    label_ids, trajectory_id (the continued child where there is one), task_id.

    Demonstrations carry no annotator, so an `annotators` filter leaves them out; dates filter them by creation.
    """
    yield from _intervention_demonstrations(project, filters)
    if filters.annotators or (filters.sources and TrajectorySource.HUMAN not in filters.sources):
        return
    trajectories = trajectory_queryset(project, filters, source=TrajectorySource.HUMAN, parent__isnull=True)
    ids = trajectories.order_by("id").values_list("id")
    for batch, conversations in item_batches(ids, lambda row: row[0], first_trajectories(0)):
        for group in batch:
            conversation = conversations[group[0][0]]
            if conversation.num_steps == 0:
                continue
            values = sft_row(
                conversation.messages,
                conversation.tools,
                source="demonstration",
                step_index=None,
                annotator_ids=[],
                label_ids=[],
                trajectory_id=conversation.trajectory_id,
                task_id=conversation.task_id,
            )
            yield ExportRow(values, "trajectory", [conversation.trajectory_id])


def _intervened_and_continued(batch: list[list]) -> set[int]:
    """Rows of interventions: column 2 holds the trajectory, column 6 its continuation (if any)."""
    return {tid for group in batch for row in group for tid in (row[2], row[6]) if tid is not None}


def _intervention_demonstrations(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    columns = ("corrected_message", "takeover_actions", "child_trajectory_id", "child_trajectory__source")
    batches = intervention_batches(project, filters, *columns, trajectory_ids=_intervened_and_continued)
    for batch, conversations in batches:
        for group in batch:
            for label_id, annotator_id, trajectory_id, step, corrected, takeover, child_id, child_src in group:
                child = conversations.get(child_id) if child_id is not None else None
                if child is not None:
                    # The child holds the corrected step at `step`; a human-sourced child was played by hand
                    # throughout, otherwise only the takeover steps were. The row ends at the last turn by hand.
                    by_hand = child.num_steps if child_src == TrajectorySource.HUMAN else step + 1 + len(takeover)
                    by_hand = min(by_hand, child.num_steps)
                    if by_hand == 0:
                        continue
                    messages = child.turns(0, child.step_starts[by_hand - 1] + 1)
                    conversation = child
                else:
                    conversation = conversations[trajectory_id]
                    if conversation.num_steps <= step:
                        continue
                    messages = [*conversation.turns(0, conversation.before_step(step)), corrected]
                values = sft_row(
                    messages,
                    conversation.tools,
                    source="takeover" if takeover or child_src == TrajectorySource.HUMAN else "intervention",
                    step_index=step,
                    annotator_ids=[annotator_id],
                    label_ids=[label_id],
                    trajectory_id=conversation.trajectory_id,
                    task_id=conversation.task_id,
                )
                yield ExportRow(values, "intervention", [label_id])
