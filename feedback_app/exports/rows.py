"""What every export kind's rows stand on: the row type, and reading labels in key order, a batch of items at a time.

Each kind's generator (`preference`, `step_preference`, `stepwise`, `unpaired`, `sft`, `critiques`, `raw`,
`returns`) reads the current labels in the order of the item they label, groups them by item, aggregates the group
(`aggregate.py`) and builds rows from the trajectories' chat turns (`conversation.py`) with the row contract
(`reward_models.rows`), fetched in bulk a batch of items at a time (the next batch's while this one is built). No
query runs per row, and nothing holds more than two batches.

Every generator yields `ExportRow(values, source, ids)`: `values` is the row as written (its columns are listed in
`schemas.py`), and `source`/`ids` name the stored rows it was made from, for a snapshot's `row_ids`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

from django.db.models import Model, QuerySet

from feedback_app.exports.aggregate import Verdict
from feedback_app.exports.conversation import Conversation, with_conversations
from feedback_app.exports.filters import ExportFilters, Style
from feedback_app.models import Intervention, Project, Trajectory

# Labels read per database round trip, and items (pairs, trajectories) per batch of conversations fetched.
CHUNK_ROWS = 5000
BATCH_ITEMS = 2000


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


def created_between(rows: QuerySet, filters: ExportFilters) -> QuerySet:
    """`rows` (labels or trajectories) created from `filters.since` to `filters.until`, either bound left open."""
    if filters.since is not None:
        rows = rows.filter(created_at__gte=filters.since)
    if filters.until is not None:
        rows = rows.filter(created_at__lte=filters.until)
    return rows


def trajectory_queryset(project: Project, filters: ExportFilters, **where: Any) -> QuerySet:
    """The trajectories of `project` that `where` selects, created between the filters' dates and made by the
    wanted policy versions: the kinds whose rows are trajectories, not labels, filter these."""
    trajectories = created_between(Trajectory.objects.filter(project=project, **where), filters)
    if filters.policy_versions:
        trajectories = trajectories.filter(policy_version_id__in=filters.policy_versions)
    return trajectories


def label_queryset(
    model: type[Model], project: Project, filters: ExportFilters, trajectory_paths: Sequence[str], *, current=True
) -> QuerySet:
    """`model`'s labels in `project` that pass the filters. `trajectory_paths` lead from the label to every
    trajectory it judges (all must come from the wanted policy versions)."""
    labels = model.objects.filter(project=project)
    if current:
        labels = labels.filter(is_current=True)
    labels = created_between(labels, filters)
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


def item_batches(
    rows: QuerySet,
    key: Callable[[tuple], Hashable],
    trajectory_ids: Callable[[list[list]], Iterable[int]],
    fetch: Callable[[list[int]], dict[int, Conversation]] | None = None,
) -> Iterator[tuple[list[list], dict[int, Conversation]]]:
    """`rows` (a `values_list` query in item order) read `CHUNK_ROWS` at a time, grouped by item (`key`), in batches
    of about `BATCH_ITEMS` items, each with the conversations of the trajectories it names (`trajectory_ids`, fetched
    by `fetch`; see `conversation.with_conversations`)."""
    groups = grouped_batches(rows.iterator(chunk_size=CHUNK_ROWS), key, BATCH_ITEMS)
    return with_conversations(groups, trajectory_ids, fetch)


def intervention_batches(
    project: Project,
    filters: ExportFilters,
    *columns: str,
    trajectory_ids: Callable[[list[list]], Iterable[int]] | None = None,
) -> Iterator[tuple[list[list], dict[int, Conversation]]]:
    """The interventions `filters` select, in trajectory and step order, as rows of (id, annotator_id, trajectory_id,
    step index, *`columns`) grouped by trajectory, in batches with the conversations of the intervened trajectories
    (or of those `trajectory_ids` names)."""
    labels = label_queryset(Intervention, project, filters, ("trajectory",))
    rows = labels.order_by("trajectory_id", "step__index", "id").values_list(
        "id", "annotator_id", "trajectory_id", "step__index", *columns
    )
    return item_batches(rows, lambda row: row[2], trajectory_ids or first_trajectories(2))


def first_trajectories(column: int) -> Callable[[list[list]], set[int]]:
    """The trajectory ids a batch needs, when column `column` of its rows holds them."""
    return lambda batch: {group[0][column] for group in batch}


def provenance(verdict: Verdict) -> tuple[list[int], list[int]]:
    """Label ids and annotator ids a row rests on, both sorted."""
    return (
        sorted(vote.label_id for vote in verdict.considered),
        sorted({vote.annotator_id for vote in verdict.considered}),
    )


def tools_of(conversation: Conversation, style: Style) -> list | None:
    """A row's ``tools`` column: the tools the agent was offered for a conversational row, in the form TRL's
    trainers pass to `apply_chat_template(..., tools=...)`; None (no column) for a text row."""
    return conversation.tools if style == Style.CONVERSATIONAL else None
