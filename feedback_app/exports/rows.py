"""Export rows, one generator per kind, each streaming in key order with a bounded amount of memory.

Each generator reads the current labels in the order of the item they label, groups them by item, aggregates the
group (`aggregate.py`) and builds rows from the trajectories' chat turns (`conversation.py`), fetched in bulk a
batch of items at a time (the next batch's while this one is built). No query runs per row, and nothing holds more
than two batches.

Every generator yields `ExportRow(values, source, ids)`: `values` is the row as written (its columns are listed in
`schemas.py`), and `source`/`ids` name the stored rows it was made from, for a snapshot's `row_ids`.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

from django.db.models import F, Model, Q, QuerySet

from feedback_app.exports.aggregate import Verdict, Vote, aggregate
from feedback_app.exports.conversation import (
    Conversation,
    shared_steps,
    text_pair,
    text_steps,
    transcript,
    with_conversations,
)
from feedback_app.exports.filters import Aggregation, ExportFilters, Interventions, Neutral, Style, Ties
from feedback_app.models import Comparison, Critique, Intervention, Project, Rating, StepLabel, Trajectory
from feedback_app.models.trajectories import TrajectorySource
from reward_models.policy.turns import Message

# Labels read per database round trip, and items (pairs, trajectories) per batch of conversations fetched.
CHUNK_ROWS = 5000
BATCH_ITEMS = 2000

# Comparison strength (1 slight, 2 clear, 3 decisive) as the reward-model margin: the loss asks for
# r(chosen) - r(rejected) > margin, so a slight preference asks for no gap and a decisive one for a gap of 1.
MARGIN_BY_STRENGTH = {1: 0.0, 2: 0.5, 3: 1.0}
# A correction is the clearest judgement an annotator gives: the original step was bad enough to rewrite.
INTERVENTION_MARGIN = 1.0


class ExportRow:
    """One row: `values` is the row as written, `source`/`ids` the stored rows it was made from.

    A faster path for the JSONL writer: a row may bring its leading columns already as JSON text (`json_head`, e.g.
    `"prompt":[...],...`, see Conversation.json) and the remaining columns as a dict (`tail`), with `head`, a
    function that gives the leading columns as values; `values` is then built only when something reads it (the
    Parquet writer), and `{**head(), **tail}` is exactly the row that `json_head` and `tail` write."""

    __slots__ = ("source", "ids", "json_head", "tail", "_values", "_head")

    def __init__(
        self,
        values: dict[str, Any] | None,
        source: str,  # "comparison", "step_label", "rating", "intervention", "critique" or "trajectory"
        ids: list[int],
        json_head: str | None = None,
        tail: dict[str, Any] | None = None,
        head: Callable[[], dict[str, Any]] | None = None,
    ):
        if (values is None) == (head is None):
            raise ValueError(
                "an ExportRow is made from its values or from a function that makes its head: give exactly one"
            )
        self.source = source
        self.ids = ids
        self.json_head = json_head
        self.tail = tail
        self._values = values
        self._head = head

    @property
    def values(self) -> dict[str, Any]:
        if self._values is None:
            self._values = {**self._head(), **(self.tail or {})}
        return self._values


def label_queryset(
    model: type[Model], project: Project, filters: ExportFilters, trajectory_paths: Sequence[str], *, current=True
) -> QuerySet:
    """`model`'s labels in `project` that pass the filters. `trajectory_paths` lead from the label to every
    trajectory it judges (all must come from the wanted policy versions)."""
    labels = model.objects.filter(project=project)
    if current:
        labels = labels.filter(is_current=True)
    if filters.since is not None:
        labels = labels.filter(created_at__gte=filters.since)
    if filters.until is not None:
        labels = labels.filter(created_at__lte=filters.until)
    if filters.annotators:
        labels = labels.filter(annotator_id__in=filters.annotators)
    if filters.exclude_gold:
        labels = labels.exclude(assignment__item__is_gold=True)
    for path in trajectory_paths if filters.policy_versions else ():
        labels = labels.filter(**{f"{path}__policy_version_id__in": filters.policy_versions})
    for path in trajectory_paths if filters.sources else ():
        labels = labels.filter(**{f"{path}__source__in": filters.sources})
    return labels


def grouped_batches(rows: Iterable[tuple], key: Callable[[tuple], Hashable], batch_items: int) -> Iterator[list[list]]:
    """Consecutive rows with the same key form a group; groups are yielded in batches of about `batch_items`,
    never splitting a group."""
    batch: list[list] = []
    group: list = []
    current: Hashable = object()
    for row in rows:
        row_key = key(row)
        if row_key != current:
            if group:
                batch.append(group)
                if len(batch) >= batch_items:
                    yield batch
                    batch = []
            group, current = [], row_key
        group.append(row)
    if group:
        batch.append(group)
    if batch:
        yield batch


def _pair_trajectories(batch: list[list]) -> set[int]:
    return {tid for group in batch for tid in (group[0][2], group[0][3])}


def _first_trajectories(column: int) -> Callable[[list[list]], set[int]]:
    """The trajectory ids a batch needs, when column `column` of its rows holds them."""
    return lambda batch: {group[0][column] for group in batch}


def _intervened_and_continued(batch: list[list]) -> set[int]:
    """Rows of interventions: column 2 holds the trajectory, column 6 its continuation (if any)."""
    return {tid for group in batch for row in group for tid in (row[2], row[6]) if tid is not None}


def _provenance(verdict: Verdict) -> tuple[list[int], list[int]]:
    """Label ids and annotator ids a row rests on, both sorted."""
    return (
        sorted(vote.label_id for vote in verdict.considered),
        sorted({vote.annotator_id for vote in verdict.considered}),
    )


def _styled(style: Style, prompt: list[Message], *completions: list[Message]) -> tuple:
    if style == Style.CONVERSATIONAL:
        return (prompt, *completions)
    texts = [text_pair(prompt, completion) for completion in completions]
    return (texts[0][0], *(completion for _, completion in texts))


def add_tools(values: dict[str, Any], conversation: Conversation, style: Style) -> None:
    """A conversational row carries the tools the agent was offered, in the form TRL's trainers pass to
    `apply_chat_template(..., tools=...)`; a text row has no chat template to give them to."""
    if style == Style.CONVERSATIONAL:
        values["tools"] = conversation.tools


# --- preference --------------------------------------------------------------------------------------------------


def _comparison_votes(group: list[tuple]) -> list[Vote]:
    # Rows: id, annotator_id, trajectory_a_id, trajectory_b_id, choice, strength, rationale.
    return [Vote(row[0], row[1], row[4], (row[5], row[6])) for row in group]


def _comparison_rows(labels: QuerySet, filters: ExportFilters) -> Iterator[tuple[Conversation, Conversation, Verdict]]:
    """(chosen, rejected, verdict) for every A-or-B verdict on the pairs `labels` judge, and with `ties=include`
    (a, b, verdict) for every tie verdict, in canonical order; both-bad gives none."""
    ties = filters.ties == Ties.INCLUDE
    rows = (
        labels.order_by("trajectory_a_id", "trajectory_b_id", "id")
        .values_list("id", "annotator_id", "trajectory_a_id", "trajectory_b_id", "choice", "strength", "rationale")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    batches = grouped_batches(rows, lambda row: (row[2], row[3]), BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _pair_trajectories):
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


def _comparison_values(verdict: Verdict) -> dict[str, Any]:
    """margin, agreement, rationale and provenance of a verdict. A tie asks for no gap, whatever its strength."""
    if len(verdict.considered) == 1:  # one label: nothing to average or merge
        vote = verdict.considered[0]
        return {
            "margin": 0.0 if verdict.value == "tie" else MARGIN_BY_STRENGTH[vote.extra[0]],
            "agreement": verdict.agreement,
            "rationale": vote.extra[1],
            "annotator_ids": [vote.annotator_id],
            "label_ids": [vote.label_id],
        }
    label_ids, annotator_ids = _provenance(verdict)
    if verdict.value == "tie":
        margin = 0.0
    else:
        margin = sum(MARGIN_BY_STRENGTH[vote.extra[0]] for vote in verdict.supporting) / len(verdict.supporting)
    return {
        "margin": margin,
        "agreement": verdict.agreement,
        "rationale": "\n\n".join(vote.extra[1] for vote in verdict.supporting if vote.extra[1]),
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
    for chosen, rejected, verdict in _comparison_rows(labels, filters):
        if chosen.num_steps == 0 or rejected.num_steps == 0:
            continue
        # Same task, so normally the same prompt; if an imported pair starts from different observations, only the
        # messages both prompts begin with are shared.
        cut = chosen.shared_prompt(rejected)
        tail = _comparison_values(verdict)
        tail["task_id"] = chosen.task_id
        tail["chosen_trajectory_id"] = chosen.trajectory_id
        tail["rejected_trajectory_id"] = rejected.trajectory_id
        if conversational:
            tail["tools"] = chosen.tools
        if ties:
            tail["tie"] = verdict.value == "tie"
        if conversational:
            json_head = f'"prompt":{chosen.json(0, cut)},"chosen":{chosen.json(cut)},"rejected":{rejected.json(cut)}'
            head = functools.partial(_conversational_head, chosen, rejected, cut)
            yield ExportRow(None, "comparison", tail["label_ids"], json_head, tail, head)
        else:
            prompt, chosen_part, rejected_part = _styled(
                filters.style, chosen.messages[:cut], chosen.messages[cut:], rejected.messages[cut:]
            )
            values = {"prompt": prompt, "chosen": chosen_part, "rejected": rejected_part, **tail}
            yield ExportRow(values, "comparison", tail["label_ids"])


def _conversational_head(chosen: Conversation, rejected: Conversation, cut: int) -> dict[str, list[Message]]:
    return {"prompt": chosen.turns(0, cut), "chosen": chosen.turns(cut), "rejected": rejected.turns(cut)}


# --- step_preference ---------------------------------------------------------------------------------------------


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
    labels = label_queryset(Intervention, project, filters, ("trajectory",))
    rows = (
        labels.order_by("trajectory_id", "step__index", "id")
        .values_list(
            "id",
            "annotator_id",
            "trajectory_id",
            "step__index",
            "original_message",
            "corrected_message",
            "reason",
            "child_trajectory_id",
        )
        .iterator(chunk_size=CHUNK_ROWS)
    )
    batches = grouped_batches(rows, lambda row: row[2], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _first_trajectories(2)):
        for group in batch:
            conversation = conversations[group[0][2]]
            for label_id, annotator_id, _, step, original, corrected, reason, child_id in group:
                if original == corrected or conversation.num_steps <= step:
                    continue
                prompt, chosen, rejected = _styled(
                    filters.style, conversation.turns(0, conversation.before_step(step)), [corrected], [original]
                )
                values = {
                    "prompt": prompt,
                    "chosen": chosen,
                    "rejected": rejected,
                    "margin": INTERVENTION_MARGIN,
                    "agreement": 1.0,
                    "rationale": reason,
                    "annotator_ids": [annotator_id],
                    "label_ids": [label_id],
                    "source": "intervention",
                    "step_index": step,
                    "task_id": conversation.task_id,
                    "chosen_trajectory_id": child_id,
                    "rejected_trajectory_id": conversation.trajectory_id,
                }
                add_tools(values, conversation, filters.style)
                if ties:
                    values["tie"] = False
                yield ExportRow(values, "intervention", [label_id])


def _branch_comparison_pairs(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    labels = label_queryset(Comparison, project, filters, ("trajectory_a", "trajectory_b")).filter(
        Q(trajectory_a__parent_id=F("trajectory_b_id"))
        | Q(trajectory_b__parent_id=F("trajectory_a_id"))
        | Q(trajectory_a__parent_id=F("trajectory_b__parent_id"))
    )
    for chosen, rejected, verdict in _comparison_rows(labels, filters):
        step = shared_steps(chosen, rejected)
        if not step:  # None or 0: no shared step, so this is a whole-trajectory preference
            continue
        cut = chosen.before_step(step)
        prompt, chosen_part, rejected_part = _styled(
            filters.style, chosen.messages[:cut], chosen.messages[cut:], rejected.messages[cut:]
        )
        values = {"prompt": prompt, "chosen": chosen_part, "rejected": rejected_part, **_comparison_values(verdict)}
        values.update(
            source="comparison",
            step_index=step,
            task_id=chosen.task_id,
            chosen_trajectory_id=chosen.trajectory_id,
            rejected_trajectory_id=rejected.trajectory_id,
        )
        add_tools(values, chosen, filters.style)
        if filters.ties == Ties.INCLUDE:
            values["tie"] = verdict.value == "tie"
        yield ExportRow(values, "comparison", values["label_ids"])


# --- stepwise ----------------------------------------------------------------------------------------------------

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
    rows = (
        labels.order_by("step__trajectory_id", "step__index", "id")
        .values_list("id", "annotator_id", "value", "step__trajectory_id", "step__index")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    neutral = _NEUTRAL_AS[filters.neutral]
    batches = grouped_batches(rows, lambda row: row[3], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _first_trajectories(3)):
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
    completions, start = [], 0
    for step in steps:
        completions.append(_joined(pieces[start : step + 1], style))
        start = step + 1
    considered = [vote for step in steps for vote in verdicts[step].considered]
    label_ids = sorted(vote.label_id for vote in considered)
    values = {
        "prompt": prompt,
        "completions": completions,
        "labels": [bool(verdicts[step].value) for step in steps],
        "step_indices": steps,
        "agreement": min(verdicts[step].agreement for step in steps),
        "annotator_ids": sorted({vote.annotator_id for vote in considered}),
        "label_ids": label_ids,
        "trajectory_id": conversation.trajectory_id,
        "task_id": conversation.task_id,
        "source": "label",
    }
    add_tools(values, conversation, style)
    return ExportRow(values, "step_label", label_ids)


def step_pieces(conversation: Conversation, style: Style) -> tuple[Any, list[Any]]:
    """The prompt and one piece per step: piece ``i`` runs from the end of step ``i - 1``'s assistant message to
    the end of step ``i``'s, so it holds what came back after step ``i - 1`` and step ``i``'s turn, and the prompt
    followed by every piece is the conversation up to the last turn. Conversational: message lists; text: the
    transcript cut at the same places (`turns.text_steps`)."""
    if style == Style.TEXT:
        return text_steps(conversation.messages)
    ends = [start + 1 for start in conversation.step_starts]
    starts = [conversation.prompt_length, *ends[:-1]]
    return conversation.turns(0, conversation.prompt_length), [
        conversation.turns(start, end) for start, end in zip(starts, ends, strict=True)
    ]


def _joined(pieces: list[Any], style: Style) -> Any:
    """Consecutive pieces as one (an unlabelled step is merged into the next labelled one)."""
    if style == Style.TEXT:
        return "".join(pieces)
    return [message for piece in pieces for message in piece]


def intervention_step_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Step labels that interventions imply, as in RLIF: the annotator let every step before the intervened one
    stand (accepted, True) and replaced the intervened one (rejected, False). One row per current intervention,
    with the stepwise columns: the pieces of steps 0..k of the intervened trajectory (which holds the original step
    k), agreement 1.0, the intervention's annotator and id, and source "intervention". An intervention whose
    correction is the original decision again rejected nothing and gives no row."""
    labels = label_queryset(Intervention, project, filters, ("trajectory",))
    rows = (
        labels.order_by("trajectory_id", "step__index", "id")
        .values_list(
            "id",
            "annotator_id",
            "trajectory_id",
            "step__index",
            "original_message",
            "corrected_message",
        )
        .iterator(chunk_size=CHUNK_ROWS)
    )
    batches = grouped_batches(rows, lambda row: row[2], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _first_trajectories(2)):
        for group in batch:
            conversation = conversations.get(group[0][2])
            if conversation is None:  # deleted while the export ran
                continue
            prompt, pieces = step_pieces(conversation, filters.style)
            for label_id, annotator_id, _, step, original, corrected in group:
                if conversation.num_steps <= step or original == corrected:
                    continue
                values = {
                    "prompt": prompt,
                    "completions": pieces[: step + 1],
                    "labels": [True] * step + [False],
                    "step_indices": list(range(step + 1)),
                    "agreement": 1.0,
                    "annotator_ids": [annotator_id],
                    "label_ids": [label_id],
                    "trajectory_id": conversation.trajectory_id,
                    "task_id": conversation.task_id,
                    "source": "intervention",
                }
                add_tools(values, conversation, filters.style)
                yield ExportRow(values, "intervention", [label_id])


# --- unpaired ----------------------------------------------------------------------------------------------------


def rating_is_desirable(score: int | None, thumb_up: bool | None) -> bool | None:
    """A thumb decides; otherwise a 1–5 score of 4 or more is desirable, 2 or less undesirable, 3 says nothing."""
    if thumb_up is not None:
        return thumb_up
    if score is None or score == 3:
        return None
    return score >= 4


def unpaired_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """KTO-style unpaired feedback from ratings and thumbs: `prompt` (instruction and first observation),
    `completion` (the rest of the trajectory) and `label` (desirable or not; see `rating_is_desirable`). Also:
    agreement, annotator_ids, label_ids, trajectory_id, task_id."""
    labels = label_queryset(Rating, project, filters, ("trajectory",))
    rows = (
        labels.order_by("trajectory_id", "id")
        .values_list("id", "annotator_id", "trajectory_id", "score", "thumb_up")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    batches = grouped_batches(rows, lambda row: row[2], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _first_trajectories(2)):
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
                prompt, completion = _styled(filters.style, conversation.turns(0, cut), conversation.turns(cut))
                label_ids, annotator_ids = _provenance(verdict)
                values = {
                    "prompt": prompt,
                    "completion": completion,
                    "label": bool(verdict.value),
                    "agreement": verdict.agreement,
                    "annotator_ids": annotator_ids,
                    "label_ids": label_ids,
                    "trajectory_id": conversation.trajectory_id,
                    "task_id": conversation.task_id,
                }
                add_tools(values, conversation, filters.style)
                yield ExportRow(values, "rating", label_ids)


# --- sft -----------------------------------------------------------------------------------------------------------


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
    trajectories = Trajectory.objects.filter(project=project, source=TrajectorySource.HUMAN, parent__isnull=True)
    if filters.since is not None:
        trajectories = trajectories.filter(created_at__gte=filters.since)
    if filters.until is not None:
        trajectories = trajectories.filter(created_at__lte=filters.until)
    if filters.policy_versions:
        trajectories = trajectories.filter(policy_version_id__in=filters.policy_versions)
    ids = trajectories.order_by("id").values_list("id", flat=True).iterator(chunk_size=CHUNK_ROWS)
    batches = grouped_batches(((tid,) for tid in ids), lambda row: row[0], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _first_trajectories(0)):
        for group in batch:
            conversation = conversations[group[0][0]]
            if conversation.num_steps == 0:
                continue
            values = {
                "messages": conversation.messages,
                "tools": conversation.tools,
                "source": "demonstration",
                "step_index": None,
                "annotator_ids": [],
                "label_ids": [],
                "trajectory_id": conversation.trajectory_id,
                "task_id": conversation.task_id,
            }
            yield ExportRow(values, "trajectory", [conversation.trajectory_id])


def _intervention_demonstrations(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    labels = label_queryset(Intervention, project, filters, ("trajectory",))
    rows = (
        labels.order_by("trajectory_id", "step__index", "id")
        .values_list(
            "id",
            "annotator_id",
            "trajectory_id",
            "step__index",
            "corrected_message",
            "takeover_actions",
            "child_trajectory_id",
            "child_trajectory__source",
        )
        .iterator(chunk_size=CHUNK_ROWS)
    )
    batches = grouped_batches(rows, lambda row: row[2], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _intervened_and_continued):
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
                values = {
                    "messages": messages,
                    "tools": conversation.tools,
                    "source": "takeover" if takeover or child_src == TrajectorySource.HUMAN else "intervention",
                    "step_index": step,
                    "annotator_ids": [annotator_id],
                    "label_ids": [label_id],
                    "trajectory_id": conversation.trajectory_id,
                    "task_id": conversation.task_id,
                }
                yield ExportRow(values, "intervention", [label_id])


# --- critiques -----------------------------------------------------------------------------------------------------


def critique_request(step_index: int | None, span_field: str, span_text: str) -> str:
    """What the critic is asked, after the transcript (which ends at the critiqued step, if there is one)."""
    if step_index is None:
        return "Critique this trajectory."
    if span_field:
        return f'Critique this part of the last step\'s {span_field}: "{span_text}"'
    return "Critique the last step."


def critique_rows(project: Project, filters: ExportFilters) -> Iterator[ExportRow]:
    """Generative-critic data: `prompt` asks for a critique of the trajectory (or of its last step, or a span of
    it) shown as a transcript; `completion` is the annotator's critique. Also: trajectory_id, task_id,
    step_index, span_field, span_start, span_end, span_text, tags, annotator_ids, label_ids."""
    labels = label_queryset(Critique, project, filters, ("trajectory",))
    rows = (
        labels.order_by("trajectory_id", "id")
        .values_list(
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
        .iterator(chunk_size=CHUNK_ROWS)
    )
    batches = grouped_batches(rows, lambda row: row[2], BATCH_ITEMS)
    for batch, conversations in with_conversations(batches, _first_trajectories(2)):
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
                request = f"{transcript(shown)}\n\n{critique_request(step, field, span_text)}"
                prompt, completion = _styled(
                    filters.style,
                    [{"role": "user", "content": request}],
                    [{"role": "assistant", "content": text}],
                )
                values = {
                    "prompt": prompt,
                    "completion": completion,
                    "trajectory_id": conversation.trajectory_id,
                    "task_id": conversation.task_id,
                    "step_index": step,
                    "span_field": field,
                    "span_start": start,
                    "span_end": end,
                    "span_text": span_text,
                    "tags": list(tags),
                    "annotator_ids": [annotator_id],
                    "label_ids": [label_id],
                }
                yield ExportRow(values, "critique", [label_id])
