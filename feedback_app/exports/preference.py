"""The `preference` export (whole-trajectory pairs from comparisons), and reading comparisons into verdicts, which
the `step_preference` export's branch pairs share."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from django.db.models import QuerySet

from feedback_app.exports.aggregate import Verdict, Vote, aggregate
from feedback_app.exports.conversation import Conversation
from feedback_app.exports.filters import ExportFilters, Style, Ties
from feedback_app.exports.rows import ExportRow, item_batches, label_queryset, provenance
from feedback_app.models import Comparison, Project
from reward_models.policy.turns import Message
from reward_models.rows import MARGIN_BY_STRENGTH, pair_row, preference_columns, split_pair


def _pair_trajectories(batch: list[list]) -> set[int]:
    return {tid for group in batch for tid in (group[0][2], group[0][3])}


def _comparison_votes(group: list[tuple]) -> list[Vote]:
    # Rows: id, annotator_id, trajectory_a_id, trajectory_b_id, choice, strength, rationale.
    return [Vote(row[0], row[1], row[4], (row[5], row[6])) for row in group]


def comparison_verdicts(
    labels: QuerySet, filters: ExportFilters
) -> Iterator[tuple[Conversation, Conversation, Verdict]]:
    """(chosen, rejected, verdict) for every A-or-B verdict on the pairs `labels` judge, and with `ties=include`
    (a, b, verdict) for every tie verdict, in canonical order; both-bad gives none."""
    ties = filters.ties == Ties.INCLUDE
    rows = labels.order_by("trajectory_a_id", "trajectory_b_id", "id").values_list(
        "id", "annotator_id", "trajectory_a_id", "trajectory_b_id", "choice", "strength", "rationale"
    )
    for batch, conversations in item_batches(rows, lambda row: (row[2], row[3]), _pair_trajectories):
        for group in batch:
            a, b = conversations.get(group[0][2]), conversations.get(group[0][3])
            if a is None or b is None:  # deleted while the export ran
                continue
            for verdict in aggregate(_comparison_votes(group), filters.aggregate, filters.min_agreement):
                if verdict.value == "a":
                    yield a, b, verdict
                elif verdict.value == "b":
                    yield b, a, verdict
                elif ties and verdict.value == "tie":
                    yield a, b, verdict


def comparison_judgement(verdict: Verdict) -> dict[str, Any]:
    """The columns a verdict gives its preference or step_preference row, by name: margin, agreement, rationale,
    annotator_ids, label_ids. A tie asks for no gap, whatever its strength."""
    if len(verdict.considered) == 1:  # one label: nothing to average or merge
        vote = verdict.considered[0]
        margin = 0.0 if verdict.value == "tie" else MARGIN_BY_STRENGTH[vote.extra[0]]
        rationale, annotator_ids, label_ids = vote.extra[1], [vote.annotator_id], [vote.label_id]
    else:
        label_ids, annotator_ids = provenance(verdict)
        if verdict.value == "tie":
            margin = 0.0
        else:
            margin = sum(MARGIN_BY_STRENGTH[vote.extra[0]] for vote in verdict.supporting) / len(verdict.supporting)
        rationale = "\n\n".join(vote.extra[1] for vote in verdict.supporting if vote.extra[1])
    return {
        "margin": margin,
        "agreement": verdict.agreement,
        "rationale": rationale,
        "annotator_ids": annotator_ids,
        "label_ids": label_ids,
    }


def preference_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Whole-trajectory preferences from comparisons: the prompt is the instruction and the first observation, and
    `chosen`/`rejected` are the rest of each trajectory as alternating assistant (decision) and user (observation)
    turns. Columns: prompt, chosen, rejected, margin, agreement, rationale, annotator_ids, label_ids, task_id,
    chosen_trajectory_id, rejected_trajectory_id, and with `ties=include` also tie (a tie verdict's row has the pair
    in canonical order, lower trajectory id as `chosen`, and margin 0; every other row has tie false). With the
    default `ties=drop` the column is absent, so the file is byte for byte what it was before ties could be exported
    and TRL's `RewardTrainer` never trains a tie as a preference."""
    labels = label_queryset(Comparison, project, filters, ("trajectory_a", "trajectory_b"))
    conversational = filters.style == Style.CONVERSATIONAL
    ties = filters.ties == Ties.INCLUDE
    for chosen, rejected, verdict in comparison_verdicts(labels, filters):
        if chosen.num_steps == 0 or rejected.num_steps == 0:
            continue
        # Same task, so normally the same prompt; if an imported pair starts from different observations, only the
        # messages both prompts begin with are shared.
        cut = chosen.shared_prompt(rejected)
        judgement = comparison_judgement(verdict)
        label_ids = judgement["label_ids"]
        columns = preference_columns(
            **judgement,
            task_id=chosen.task_id,
            chosen_trajectory_id=chosen.trajectory_id,
            rejected_trajectory_id=rejected.trajectory_id,
            tools=chosen.tools if conversational else None,
            tie=verdict.value == "tie" if ties else None,
        )
        if conversational:
            json_head = f'"prompt":{chosen.json(0, cut)},"chosen":{chosen.json(cut)},"rejected":{rejected.json(cut)}'
            head = functools.partial(_conversational_head, chosen, rejected, cut)
            yield ExportRow(None, "comparison", label_ids, json_head, columns, head)
        else:
            values = pair_row(*split_pair(chosen.messages, rejected.messages, cut, filters.style), columns)
            yield ExportRow(values, "comparison", label_ids)


def _conversational_head(chosen: Conversation, rejected: Conversation, cut: int) -> dict[str, list[Message]]:
    return {"prompt": chosen.turns(0, cut), "chosen": chosen.turns(cut), "rejected": rejected.turns(cut)}
