"""The queue's statements on the annotators' busiest request: the user's current lease, leasing the next item, and
counting a label towards its item (see `feedback_app.hot_path`). `feedback_app.queue` decides when each is used.

On PostgreSQL the open item's row is locked with FOR UPDATE SKIP LOCKED, so annotators asking at the same moment
take different items instead of queueing behind one lock, and the usual lease, and the usual insert-and-count of a
label, are each one statement (its own transaction). SQLite serialises writers (IMMEDIATE transactions) and takes
the transactional path. The unique slot index is the last line of defence on both. The items these statements
lease are those `feedback_app.queue.open_items` lists (the ORM's, for the counts on every page); a test holds the
two to the same meaning.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache

from django.db import IntegrityError, connection, transaction

from feedback_app.hot_path.rows import Rows, fetch_all, fetch_one, moment, sql_cursor
from feedback_app.models import Assignment, Project, QueueItem
from feedback_app.models.queue import AssignmentStatus

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


def current_lease(project: Project, user, kind: str | None, now: datetime) -> Assignment | None:
    """The user's oldest unexpired lease in `project` (of `kind`, if given), with its item."""
    sql = f"""
        SELECT {ASSIGNMENT_COLUMNS}
        FROM {_ASSIGNMENTS.table} JOIN {_ITEMS.table} ON qi.id = a.item_id
        WHERE a.annotator_id = %s AND qi.project_id = %s {"AND qi.kind = %s" if kind else ""}
          AND a.status = %s AND a.leased_until >= %s
        ORDER BY a.created_at LIMIT 1
    """
    params = [user.pk, project.pk, *([kind] if kind else []), AssignmentStatus.LEASED, moment(now)]
    row = fetch_one(sql, params)
    return None if row is None else assignment_from_row(row, project)


# Row locks on PostgreSQL: none (SQLite), waiting for a locked row, or skipping locked rows.
_LOCKS = {"none": "", "wait": "FOR UPDATE OF qi", "skip": "FOR UPDATE OF qi SKIP LOCKED"}


def open_item_sql(kind: str | None, lock: str) -> str:
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


def open_item(project: Project, user, kind: str | None, is_gold: bool, now: datetime, lock: str) -> QueueItem | None:
    params = [project.pk, is_gold, *([kind] if kind else []), user.pk]
    params += [AssignmentStatus.DONE, AssignmentStatus.LEASED, moment(now)]
    row = fetch_one(open_item_sql(kind, lock), params)
    return None if row is None else _ITEMS.read(row)


def take_one(project: Project, user, kind: str | None, is_gold: bool, now: datetime) -> Assignment | None:
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
        item, assignment = lease_at_once(project, user, kind, is_gold, now)
        if assignment is not None:
            return assignment
        wait_first = item is None  # it found no open item to lock, so the first look below waits for one at once
    for attempt in range(LEASE_ATTEMPTS):
        try:
            with transaction.atomic():
                item = None
                if not (wait_first and attempt == 0):
                    item = open_item(project, user, kind, is_gold, now, "skip" if locks else "none")
                if item is None and locks:
                    # Every open item is locked by someone else this very moment: wait for one rather than report
                    # an empty queue.
                    item = open_item(project, user, kind, is_gold, now, "wait")
                if item is None:
                    return None
                slot = free_slot(item, now)
                if slot is None:  # filled while this request waited for its lock
                    continue
                return _lease(item, user, slot, now + timedelta(minutes=project.lease_minutes), now)
        except IntegrityError:
            # Another request took this slot (or the user's own double request took this item).
            continue
    return None


LEASE_ATTEMPTS = 50  # each failed one is a lease someone else got; the cap only guards against a bug looping forever


def lease_at_once(
    project: Project, user, kind: str | None, is_gold: bool, now: datetime
) -> tuple[QueueItem | None, Assignment | None]:
    """On PostgreSQL, `take_one`'s usual case in one statement, which is its own transaction: lock the open item
    (skipping locked ones) and lease its lowest free slot, unless one of its leases has expired and must be marked so
    first. Returns the item and the lease; the lease is None, with nothing written, in every other case (an expired
    lease to mark, a slot taken after this statement's snapshot), and the item too where no open item was free to
    lock; `take_one`'s transaction handles them. Saves a statement, BEGIN and COMMIT on the annotators' busiest
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


# The columns of a lease that `lease_at_once`'s statement chooses: the item, and its lowest free slot.
_CHOSEN = {"item_id": "chosen.id", "slot": "chosen.free"}


@cache
def _lease_at_once_sql(kind: str | None) -> str:
    inserted = ", ".join(_CHOSEN.get(field.attname, "%s") for field in _ASSIGNMENTS.inserted)
    return f"""
        WITH item AS ({open_item_sql(kind, "skip")}),
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


def free_slot(item: QueueItem, now: datetime) -> int | None:
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


def count_live(assignment: Assignment, now: datetime) -> tuple[bool, bool]:
    """Count the label of `assignment`, whose lease is live, towards its item, unless the assignment is no longer
    leased in the database. Updating the item first takes its row lock in the same order as `take_one` (item, then
    its assignments). PostgreSQL marks the assignment done in the same statement. Returns (counted, finished)."""
    params = [assignment.item_id, assignment.pk, AssignmentStatus.LEASED]
    with sql_cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_COUNT_AND_FINISH_SQL, [*params, AssignmentStatus.DONE, moment(now), assignment.pk])
            counted = cursor.rowcount == 1
            return counted, counted
        cursor.execute(_COUNT_SQL, params)
        return cursor.rowcount == 1, False


def save_finished(assignment: Assignment, now: datetime) -> None:
    """Store the finished `assignment`'s slot and status, finished at `now`."""
    with sql_cursor() as cursor:
        cursor.execute(
            f"UPDATE {_ASSIGNMENTS.name} SET slot = %s, status = %s, finished_at = %s WHERE id = %s",
            [assignment.slot, assignment.status, moment(now), assignment.pk],
        )


def _count_sql(condition: str) -> str:
    """Count a label towards item %s if `condition` (an SQL query) has a row."""
    return f"UPDATE {_ITEMS.name} SET completed_count = completed_count + 1 WHERE id = %s AND EXISTS ({condition})"


_COUNT_SQL = _count_sql(f"SELECT 1 FROM {_ASSIGNMENTS.table} WHERE a.id = %s AND a.status = %s")
# Mark assignment %s done (status %s, at %s) once `counted`, the count above as a WITH query, has counted its label.
# The item's update runs first (the main statement reads its result), so the locks are taken item first, as in
# take_one.
_FINISH_SQL = (
    f"UPDATE {_ASSIGNMENTS.name} SET status = %s, finished_at = %s WHERE id = %s AND EXISTS (SELECT 1 FROM counted)"
)
_COUNT_AND_FINISH_SQL = f"WITH counted AS ({_COUNT_SQL} RETURNING id) {_FINISH_SQL}"


def insert_counted(rows: Rows, label, assignment: Assignment, now: datetime) -> bool:
    """On PostgreSQL, in one statement: insert the new `label` (an instance of `rows`' model) and count it towards
    its item, if `assignment`'s lease is live and no unique index refuses the label; the assignment is marked done
    in the database (not on `assignment`). Returns whether it did; when it did not, nothing was written."""
    at = moment(now)
    params = [*rows.values(label), assignment.pk, AssignmentStatus.LEASED, at, assignment.item_id]
    row = fetch_one(_insert_counted_sql(rows), [*params, AssignmentStatus.DONE, at, assignment.pk])
    if row is None:
        return False
    rows.stored(label, row[0])
    return True


@cache
def _insert_counted_sql(rows: Rows) -> str:
    """`insert_counted`'s statement for labels of `rows`' model. Parameters: the label's values, the assignment,
    the leased status, now, the item, the done status, now, the assignment. The item is updated before the
    assignment, the lock order of `take_one`."""
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
