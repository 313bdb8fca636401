"""The `returns` export, for the value critic: trajectories with their steps' environment rewards and outcome.
Its rows are trajectories, not labels, so it reads no labels and takes no annotator or gold filter."""

from __future__ import annotations

from collections.abc import Iterator

from feedback_app.exports.conversation import Conversation, fetch_conversations
from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.rows import ExportRow, item_batches, tools_of, trajectory_queryset
from feedback_app.models import Project
from reward_models.rows import returns_row, step_pieces


def returns_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Value-critic data: one row per trajectory of the project (every source, branches included), in id order:
    `prompt` (the conversation before the first step), `completions` (one piece per step, the `stepwise` layout, so
    the prompt followed by the pieces is the whole conversation up to the last turn), `rewards` (each step's
    environment reward), `success` (the stored outcome, or None), trajectory_id, task_id, policy_version_id. In the
    conversational style (the default) the prompt and pieces are message lists and the row carries the trajectory's
    `tools`, so a critic scores them with a judge trained on conversations; `style=text` gives transcript strings.

    `rewards` is None when the trajectory has none recorded. Steps store a reward of 0.0 when none was given (the
    column is not nullable), so an imported trajectory (one with an `external_id`) whose every reward is 0.0 counts
    as unrewarded; rollouts and interventions made in Tandem stepped the environment, so their zeros are real.

    Rows are trajectories, not labels: `since`/`until` bound the trajectories' creation, `policy_versions` their
    version, `sources` their source; a trajectory without steps gives no row.
    """
    trajectories = trajectory_queryset(project, filters)
    if filters.sources:
        trajectories = trajectories.filter(source__in=filters.sources)
    rows = trajectories.order_by("id").values_list("id", "success", "external_id")
    for batch, conversations in item_batches(rows, lambda row: row[0], _trajectory_ids, _conversations_with_rewards):
        for [(trajectory_id, success, external_id)] in batch:
            conversation = conversations.get(trajectory_id)
            if conversation is None or conversation.num_steps == 0:
                continue
            prompt, completions = step_pieces(conversation, filters.style)
            rewards = conversation.rewards
            if external_id is not None and not any(rewards):
                rewards = None
            values = returns_row(
                prompt,
                completions,
                rewards,
                success,
                trajectory_id=trajectory_id,
                task_id=conversation.task_id,
                policy_version_id=conversation.policy_version_id,
                tools=tools_of(conversation, filters.style),
            )
            yield ExportRow(values, "trajectory", [trajectory_id])


def _conversations_with_rewards(trajectory_ids: list[int]) -> dict[int, Conversation]:
    return fetch_conversations(trajectory_ids, rewards=True)


def _trajectory_ids(batch: list[list[tuple]]) -> set[int]:
    return {group[0][0] for group in batch}
