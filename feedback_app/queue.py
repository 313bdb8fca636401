"""The annotation queue: which item an annotator gets next, leases, skips and completion.

Each QueueItem needs `overlap` labels from different annotators; an Assignment holds one numbered slot of it. The
database keeps the invariants (one assignment per annotator and item, one live assignment per slot); this module
chooses fairly and fast. On PostgreSQL the candidate row is locked with FOR UPDATE SKIP LOCKED, so annotators asking
at the same moment take different items instead of queueing behind one lock. SQLite serialises writers (IMMEDIATE
transactions), and the unique slot index is the last line of defence on both.

Leases expire lazily: a leased slot whose time has passed counts as free for everyone else, and it is marked
expired when someone takes the item or when its annotator comes back.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import cache

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from feedback_app.models import Assignment, LabelKind, Project, QueueItem, Trajectory
from feedback_app.models.queue import AssignmentStatus
from feedback_app.rows import MAX_ID, Rows, fetch_all, fetch_one, moment, sql_cursor


class LeaseLost(Exception):
    """The lease expired and the item has since received all its labels: the label cannot be counted."""


# The query strategy of comparisons of a new policy version against its parent: always shown blind.
REVIEW_STRATEGY = "new_vs_parent"


def _live(now: datetime) -> Q:
    """Assignments that hold their slot: labelled, or leased and not yet expired."""
    return Q(status=AssignmentStatus.DONE) | Q(status=AssignmentStatus.LEASED, leased_until__gte=now)


def open_items(project: Project, user, *, kind: str | None = None, now: datetime | None = None) -> QuerySet:
    """Items of `project` that still need labels, that `user` has never been given, with a free slot."""
    now = now or timezone.now()
    held = (
        Assignment.objects.filter(item=OuterRef("pk"))
        .filter(_live(now))
        .order_by()
        .values("item")
        .annotate(n=Count("pk"))
        .values("n")
    )
    items = QueueItem.objects.filter(project=project, completed_count__lt=F("overlap"))
    if kind:
        items = items.filter(kind=kind)
    return (
        items.exclude(Exists(Assignment.objects.filter(item=OuterRef("pk"), annotator=user)))
        .alias(held=Coalesce(Subquery(held), 0))  # filtered on, not selected
        .filter(held__lt=F("overlap"))
        .order_by("-priority", "id")
    )


def current_assignment(project: Project, user, *, kind: str | None = None, now: datetime | None = None):
    """The user's unexpired lease in this project, if any (so a reload resumes the same item), with its item."""
    return _assignment_with_item(
        "a.status = %s AND a.leased_until >= %s",
        [AssignmentStatus.LEASED, moment(now or timezone.now())],
        project,
        user,
        kind,
    )


def own_assignment(project: Project, user, pk: int, *, kind: str | None = None) -> Assignment | None:
    """The user's assignment `pk` in `project` (of `kind`, if given), with its item; None for anyone else's."""
    return _assignment_with_item("a.id = %s", [pk], project, user, kind) if pk <= MAX_ID else None


def _assignment_with_item(condition: str, params: list, project: Project, user, kind: str | None):
    """The user's oldest assignment in `project` that meets `condition` (SQL on `a`, the assignment), with its item."""
    sql = f"""
        SELECT {ASSIGNMENT_COLUMNS}
        FROM {_ASSIGNMENTS.table} JOIN {_ITEMS.table} ON qi.id = a.item_id
        WHERE a.annotator_id = %s AND qi.project_id = %s {"AND qi.kind = %s" if kind else ""} AND {condition}
        ORDER BY a.created_at LIMIT 1
    """
    row = fetch_one(sql, [user.pk, project.pk, *([kind] if kind else []), *params])
    return None if row is None else assignment_from_row(row, project)


def next_assignment(
    user,
    project: Project,
    *,
    kind: str | None = None,
    now: datetime | None = None,
    rng: random.Random | None = None,
    resume: bool = True,
) -> Assignment | None:
    """Lease the next item for `user`: the current lease if there is one, else the highest-priority open item.

    Gold items are mixed in unannounced: with probability `project.gold_fraction` a gold item is preferred, while
    the user has gold items left. Returns None when nothing is left for this user.

    `resume=False` skips the look for a current lease, for a caller that has just finished the user's live lease of
    `kind`: while a lease is live, asking for the next item gives that lease back, so the user holds no other (unless
    two requests raced to make the first; the second lease then runs out and its slot returns to the pool).
    """
    now = now or timezone.now()
    resumed = current_assignment(project, user, kind=kind, now=now) if resume else None
    if resumed is not None:
        return resumed
    prefer_gold = (rng or random).random() < project.gold_fraction
    for gold_first in (prefer_gold, not prefer_gold):
        assignment = _take_one(project, user, kind, gold_first, now)
        if assignment is not None:
            return assignment
    return None


# The annotators' busiest path (every submit-and-next leases an item) is written in SQL (see feedback_app/rows.py).
_ITEMS = Rows(QueueItem, "qi")
_ASSIGNMENTS = Rows(Assignment, "a")

# An assignment's columns with its item's, from the tables `a` and `qi`: `assignment_from_row` reads them.
ASSIGNMENT_COLUMNS = f"{_ASSIGNMENTS.columns}, {_ITEMS.columns}"
ASSIGNMENT_TABLE, ITEM_TABLE = _ASSIGNMENTS.table, _ITEMS.table


def assignment_from_row(row, project: Project) -> Assignment:
    """The assignment, with its item of `project`, from a row that starts with ASSIGNMENT_COLUMNS."""
    assignment = _ASSIGNMENTS.read(row)
    assignment.item = _ITEMS.read(row[_ASSIGNMENTS.width :])
    assignment.item.project = project  # the row the caller already has: no second fetch
    return assignment


# Row locks on PostgreSQL: none (SQLite), waiting for a locked row, or skipping locked rows.
_LOCKS = {"none": "", "wait": "FOR UPDATE OF qi", "skip": "FOR UPDATE OF qi SKIP LOCKED"}


def _open_item_sql(kind: str | None, lock: str) -> str:
    """The highest-priority item that `open_items` would give first, of one gold-ness, locked as `_LOCKS[lock]`
    says. Parameters: project, is_gold, [kind], user, done, leased, now."""
    return f"""
        SELECT {_ITEMS.columns} FROM {_ITEMS.table}
        WHERE qi.project_id = %s AND qi.is_gold = %s {"AND qi.kind = %s" if kind else ""}
          AND qi.completed_count < qi.overlap
          AND NOT EXISTS (SELECT 1 FROM {_ASSIGNMENTS.table} WHERE a.item_id = qi.id AND a.annotator_id = %s)
          AND (SELECT COUNT(*) FROM {_ASSIGNMENTS.table}
               WHERE a.item_id = qi.id AND (a.status = %s OR (a.status = %s AND a.leased_until >= %s))) < qi.overlap
        ORDER BY qi.priority DESC, qi.id
        LIMIT 1 {_LOCKS[lock]}
    """


def _open_item(project: Project, user, kind: str | None, is_gold: bool, now: datetime, lock: str) -> QueueItem | None:
    params = [project.pk, is_gold, *([kind] if kind else []), user.pk]
    params += [AssignmentStatus.DONE, AssignmentStatus.LEASED, moment(now)]
    row = fetch_one(_open_item_sql(kind, lock), params)
    return None if row is None else _ITEMS.read(row)


def _take_one(project: Project, user, kind: str | None, is_gold: bool, now: datetime) -> Assignment | None:
    """Lease one open item. On PostgreSQL the item's row is locked, skipping rows that others hold; SQLite's
    IMMEDIATE transactions let one writer in at a time. The unique indexes catch whatever slips through; the
    transaction is then rolled back and tried again.

    Each try that fails means another annotator just took the item, so the queue moved on: giving up after a few
    would tell an annotator that the queue is empty while it is not. On PostgreSQL the candidate is chosen from the
    statement's snapshot, and a lease committed between that snapshot and the row lock fills the item under it,
    which dozens of annotators racing for the first open item make likely. (With three tries, one load-bench run in
    which this statement ran slowly told some annotators "Nothing left to compare" with 9,000 items open; that the
    misses were the cause is likely, not confirmed.)"""
    locks = connection.features.has_select_for_update_skip_locked
    wait_first = False
    if locks:
        item, assignment = _lease_at_once(project, user, kind, is_gold, now)
        if assignment is not None:
            return assignment
        wait_first = item is None  # it found no open item to lock, so the first look below waits for one at once
    for attempt in range(LEASE_ATTEMPTS):
        try:
            with transaction.atomic():
                item = None
                if not (wait_first and attempt == 0):
                    item = _open_item(project, user, kind, is_gold, now, "skip" if locks else "none")
                if item is None and locks:
                    # Every open item is locked by someone else this very moment: wait for one rather than report
                    # an empty queue.
                    item = _open_item(project, user, kind, is_gold, now, "wait")
                if item is None:
                    return None
                slot = _free_slot(item, now)
                if slot is None:  # filled while this request waited for its lock
                    continue
                return _lease(item, user, slot, now + timedelta(minutes=project.lease_minutes), now)
        except IntegrityError:
            # Another request took this slot (or the user's own double request took this item).
            continue
    return None


LEASE_ATTEMPTS = 50  # each failed one is a lease someone else got; the cap only guards against a bug looping forever


def _lease_at_once(
    project: Project, user, kind: str | None, is_gold: bool, now: datetime
) -> tuple[QueueItem | None, Assignment | None]:
    """On PostgreSQL, `_take_one`'s usual case in one statement, which is its own transaction: lock the open item
    (skipping locked ones) and lease its lowest free slot, unless one of its leases has expired and must be marked so
    first. Returns the item and the lease; the lease is None, with nothing written, in every other case (an expired
    lease to mark, a slot taken after this statement's snapshot), and the item too where no open item was free to
    lock; `_take_one`'s transaction handles them. Saves a statement, BEGIN and COMMIT on the annotators' busiest
    request."""
    until = now + timedelta(minutes=project.lease_minutes)
    assignment = Assignment(annotator=user, slot=0, leased_until=until, created_at=now)
    values = _ASSIGNMENTS.values(assignment)
    params = [project.pk, is_gold, *([kind] if kind else []), user.pk]
    params += [AssignmentStatus.DONE, AssignmentStatus.LEASED, moment(now)]  # the open item
    params += [AssignmentStatus.LEASED, moment(now), AssignmentStatus.LEASED, AssignmentStatus.DONE]  # its slots
    params += [
        value for field, value in zip(_ASSIGNMENTS.inserted, values, strict=True) if field.attname not in _CHOSEN
    ]
    row = fetch_one(_lease_at_once_sql(kind), params)
    if row is None:
        return None, None
    item = _ITEMS.read(row)
    if row[-1] is None:
        return item, None
    assignment.item, assignment.slot = item, row[-1]
    _ASSIGNMENTS.stored(assignment, row[-2])
    return item, assignment


# The columns of a lease that `_lease_at_once`'s statement chooses: the item, and its lowest free slot.
_CHOSEN = {"item_id": "chosen.id", "slot": "chosen.free"}


@cache
def _lease_at_once_sql(kind: str | None) -> str:
    inserted = ", ".join(_CHOSEN.get(field.attname, "%s") for field in _ASSIGNMENTS.inserted)
    return f"""
        WITH item AS ({_open_item_sql(kind, "skip")}),
        slots AS (
            SELECT a.slot, (a.status = %s AND a.leased_until < %s) AS expired FROM {_ASSIGNMENTS.table}
            WHERE a.item_id = (SELECT id FROM item) AND a.status IN (%s, %s)
        ),
        chosen AS (
            SELECT item.id, (SELECT min(s) FROM generate_series(0, item.overlap - 1) s
                             WHERE s NOT IN (SELECT slot FROM slots)) AS free
            FROM item WHERE NOT EXISTS (SELECT 1 FROM slots WHERE expired)
        ),
        lease AS (
            INSERT INTO {_ASSIGNMENTS.name} ({_ASSIGNMENTS.inserted_columns})
            SELECT {inserted} FROM chosen WHERE chosen.free IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING id, slot
        )
        SELECT item.*, lease.id, lease.slot FROM item LEFT JOIN lease ON true
    """


def _lease(item: QueueItem, user, slot: int, until: datetime, now: datetime) -> Assignment:
    assignment = Assignment(item=item, annotator=user, slot=slot, leased_until=until, created_at=now)
    _ASSIGNMENTS.insert(assignment)
    return assignment


def _free_slot(item: QueueItem, now: datetime) -> int | None:
    """Expire stale leases on `item`, then return its lowest free slot. Call with the item locked."""
    rows = fetch_all(
        f"SELECT {_ASSIGNMENTS.columns} FROM {_ASSIGNMENTS.table} WHERE a.item_id = %s AND a.status IN (%s, %s)",
        [item.pk, AssignmentStatus.LEASED, AssignmentStatus.DONE],
    )
    held = [_ASSIGNMENTS.read(row) for row in rows]
    stale = {a.pk for a in held if a.status == AssignmentStatus.LEASED and a.leased_until < now}
    if stale:  # usually none: one query instead of two on the annotators' busiest path
        Assignment.objects.filter(pk__in=stale).update(status=AssignmentStatus.EXPIRED)
    used = {a.slot for a in held if a.pk not in stale}
    return next((slot for slot in range(item.overlap) if slot not in used), None)


def queue_counts(project: Project, user, *, now: datetime | None = None) -> dict[str, int]:
    """How many items of each kind `user` could still be given in `project` (one query)."""
    rows = open_items(project, user, now=now).order_by().values("kind").annotate(n=Count("pk"))
    return {row["kind"]: row["n"] for row in rows}


def skip(assignment: Assignment, reason: str = "", *, now: datetime | None = None) -> Assignment:
    """Give the item back: the slot is free for others and the user will not be given the item again."""
    if assignment.status == AssignmentStatus.DONE:
        raise ValueError("assignment: this item is already labelled and cannot be skipped")
    assignment.status = AssignmentStatus.SKIPPED
    assignment.finished_at = now or timezone.now()
    assignment.skip_reason = reason[:200]
    assignment.save(update_fields=["status", "finished_at", "skip_reason"])
    return assignment


def complete(assignment: Assignment, *, now: datetime | None = None) -> Assignment:
    """Count the assignment's label towards its item. Call inside the transaction that stores the label.

    A label on an expired lease still counts if the item has a free slot; otherwise LeaseLost is raised and the
    caller's transaction rolls back. Completing twice is harmless, also through a copy of the assignment read before
    another request completed it.
    """
    now = now or timezone.now()
    if assignment.status == AssignmentStatus.DONE:
        return assignment
    counted = False
    if assignment.lease_is_live(now):
        # A live lease holds its slot, so the item has room: count the label at once, unless the assignment is no
        # longer leased in the database. Updating the item first takes its row lock in the same order as _take_one
        # (item, then its assignments). PostgreSQL marks the assignment done in the same statement.
        params = [assignment.item_id, assignment.pk, AssignmentStatus.LEASED]
        with sql_cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(_COUNT_AND_FINISH_SQL, [*params, AssignmentStatus.DONE, moment(now), assignment.pk])
                finished = counted = cursor.rowcount == 1
            else:
                cursor.execute(_COUNT_SQL, params)
                counted, finished = cursor.rowcount == 1, False
        if finished:
            assignment.status, assignment.finished_at = AssignmentStatus.DONE, now
            return assignment
    if not counted:
        item = QueueItem.objects.select_for_update().get(pk=assignment.item_id)
        stored = Assignment.objects.get(pk=assignment.pk)
        if stored.status == AssignmentStatus.DONE:  # another request (a double submit) counted it already
            assignment.status, assignment.slot, assignment.finished_at = stored.status, stored.slot, stored.finished_at
            return assignment
        Assignment.objects.filter(pk=assignment.pk).update(status=AssignmentStatus.EXPIRED)
        slot = _free_slot(item, now)
        if slot is None:
            raise LeaseLost(
                "Your lease on this item expired and other annotators have since given it all its labels, "
                "so this label was not stored. Your next item is ready."
            )
        assignment.slot = slot
        QueueItem.objects.filter(pk=item.pk).update(completed_count=F("completed_count") + 1)
    assignment.status = AssignmentStatus.DONE
    assignment.finished_at = now
    with sql_cursor() as cursor:
        cursor.execute(
            f"UPDATE {_ASSIGNMENTS.name} SET slot = %s, status = %s, finished_at = %s WHERE id = %s",
            [assignment.slot, assignment.status, moment(now), assignment.pk],
        )
    return assignment


def _count_sql(condition: str) -> str:
    """Count a label towards item %s if `condition` (an SQL query) has a row."""
    return f"UPDATE {_ITEMS.name} SET completed_count = completed_count + 1 WHERE id = %s AND EXISTS ({condition})"


_COUNT_SQL = _count_sql(f"SELECT 1 FROM {_ASSIGNMENTS.table} WHERE a.id = %s AND a.status = %s")
# Mark assignment %s done (status %s, at %s) once `counted`, the count above as a WITH query, has counted its label.
# The item's update runs first (the main statement reads its result), so the locks are taken item first, as in
# _take_one.
_FINISH_SQL = (
    f"UPDATE {_ASSIGNMENTS.name} SET status = %s, finished_at = %s WHERE id = %s AND EXISTS (SELECT 1 FROM counted)"
)
_COUNT_AND_FINISH_SQL = f"WITH counted AS ({_COUNT_SQL} RETURNING id) {_FINISH_SQL}"


def insert_counted(rows: Rows, label, assignment: Assignment, *, now: datetime | None = None) -> bool:
    """On PostgreSQL, in one statement: insert the new `label` (an instance of `rows`' model) and count it towards
    its item as `complete` would, if `assignment`'s lease is live and no unique index refuses the label. One
    statement is its own transaction, so this saves the transaction's BEGIN and COMMIT as well as a statement on the
    annotators' busiest request. Returns whether it did; when it did not, nothing was written, and the caller takes
    the transactional path, which handles every other case (an expired lease, a retried submit, a revision)."""
    now = now or timezone.now()
    at = moment(now)
    params = [*rows.values(label), assignment.pk, AssignmentStatus.LEASED, at, assignment.item_id]
    row = fetch_one(_insert_counted_sql(rows), [*params, AssignmentStatus.DONE, at, assignment.pk])
    if row is None:
        return False
    rows.stored(label, row[0])
    assignment.status, assignment.finished_at = AssignmentStatus.DONE, now
    return True


@cache
def _insert_counted_sql(rows: Rows) -> str:
    """`insert_counted`'s statement for labels of `rows`' model. Parameters: the label's values, the assignment,
    the leased status, now, the item, the done status, now, the assignment. The item is updated before the
    assignment, the lock order of `_take_one`."""
    return f"""
        WITH label AS (
            INSERT INTO {rows.name} ({rows.inserted_columns})
            SELECT {rows.placeholders} WHERE EXISTS
                (SELECT 1 FROM {_ASSIGNMENTS.table} WHERE a.id = %s AND a.status = %s AND a.leased_until >= %s)
            ON CONFLICT DO NOTHING RETURNING {rows.pk_column}
        ),
        counted AS ({_count_sql("SELECT 1 FROM label")} RETURNING id),
        finished AS ({_FINISH_SQL})
        SELECT {rows.pk_column} FROM label
    """


def enqueue_comparisons(
    project: Project,
    pairs: Iterable[tuple[Trajectory, Trajectory]],
    *,
    priority: int = 0,
    query_strategy: str = "random",
    overlap: int | None = None,
) -> list[QueueItem]:
    """Queue comparisons of trajectory pairs (same task), in canonical order; a pair already queued is skipped."""
    wanted: dict[tuple[int, int], tuple[Trajectory, Trajectory]] = {}
    for one, other in pairs:
        if one.task_id != other.task_id:
            raise ValueError(f"pairs: trajectories {one.pk} and {other.pk} are of different tasks")
        if one.pk == other.pk:
            raise ValueError(f"pairs: trajectory {one.pk} is paired with itself")
        low, high = sorted((one, other), key=lambda t: t.pk)
        wanted[(low.pk, high.pk)] = (low, high)
    existing = set(
        QueueItem.objects.filter(project=project, kind=LabelKind.COMPARISON, is_gold=False).values_list(
            "trajectory_id", "other_trajectory_id"
        )
    )
    items = [
        QueueItem(
            project=project,
            kind=LabelKind.COMPARISON,
            trajectory=low,
            other_trajectory=high,
            priority=priority,
            overlap=overlap or project.overlap,
            query_strategy=query_strategy,
        )
        for key, (low, high) in wanted.items()
        if key not in existing
    ]
    return QueueItem.objects.bulk_create(items, batch_size=1000)


def enqueue_trajectories(
    project: Project,
    trajectories: Iterable[Trajectory],
    *,
    kind: str = LabelKind.STEP_LABEL,
    priority: int = 0,
    query_strategy: str = "random",
    overlap: int | None = None,
) -> list[QueueItem]:
    """Queue single trajectories for review; a trajectory already queued is skipped.

    A single-trajectory item is served on the step page, where the annotator labels steps and may also critique,
    rate and intervene; so `step_label` is the one kind of item a lone trajectory gets.
    """
    if kind != LabelKind.STEP_LABEL:
        raise ValueError(f"kind: a single trajectory is queued for step_label review, not {kind!r}")
    trajectories = list(trajectories)
    existing = set(
        QueueItem.objects.filter(
            project=project, kind=kind, is_gold=False, trajectory__in=[t.pk for t in trajectories]
        ).values_list("trajectory_id", flat=True)
    )
    items = [
        QueueItem(
            project=project,
            kind=kind,
            trajectory=trajectory,
            priority=priority,
            overlap=overlap or project.overlap,
            query_strategy=query_strategy,
        )
        for trajectory in {t.pk: t for t in trajectories}.values()
        if trajectory.pk not in existing
    ]
    return QueueItem.objects.bulk_create(items, batch_size=1000)


def pairs_within_tasks(trajectories: Iterable[Trajectory]) -> list[tuple[Trajectory, Trajectory]]:
    """Every pair of trajectories that share a task, in id order: the simplest comparison queue."""
    by_task: dict[int, list[Trajectory]] = {}
    for trajectory in sorted(trajectories, key=lambda t: t.pk):
        by_task.setdefault(trajectory.task_id, []).append(trajectory)
    return [(a, b) for group in by_task.values() for i, a in enumerate(group) for b in group[i + 1 :]]
