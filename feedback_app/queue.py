"""The annotation queue: which item an annotator gets next, leases, skips and completion. Items are put in the
queue by `QueueItem.objects.enqueue_comparisons` and `enqueue_trajectories`.

Each QueueItem needs `overlap` labels from different annotators; an Assignment holds one numbered slot of it. The
database keeps the invariants (one assignment per annotator and item, one live assignment per slot); this module
chooses fairly, and `feedback_app.hot_path.queue_sql` fast: the lease and the count of a label are on the
annotators' busiest request, so their statements are written there once (row locks on PostgreSQL, IMMEDIATE
transactions on SQLite).

Leases expire lazily: a leased slot whose time has passed counts as free for everyone else, and it is marked
expired when someone takes the item or when its annotator comes back.
"""

from __future__ import annotations

import random
from datetime import datetime

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from feedback_app.hot_path import queue_sql
from feedback_app.hot_path.rows import MAX_ID, Rows
from feedback_app.models import Assignment, Project, QueueItem
from feedback_app.models.queue import AssignmentStatus


class LeaseLost(Exception):
    """The lease expired and the item has since received all its labels: the label cannot be counted."""


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
    return queue_sql.current_lease(project, user, kind, now or timezone.now())


def own_assignment(project: Project, user, pk: int, *, kind: str | None = None) -> Assignment | None:
    """The user's assignment `pk` in `project` (of `kind`, if given), with its item; None for anyone else's."""
    if pk > MAX_ID:
        return None
    assignments = Assignment.objects.select_related("item").filter(pk=pk, annotator=user, item__project=project)
    assignment = (assignments.filter(item__kind=kind) if kind else assignments).first()
    if assignment is not None:
        assignment.item.project = project  # the row the caller already has: no second fetch
    return assignment


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
        assignment = queue_sql.take_one(project, user, kind, gold_first, now)
        if assignment is not None:
            return assignment
    return None


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
        # A live lease holds its slot, so the item has room: count the label at once.
        counted, finished = queue_sql.count_live(assignment, now)
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
        slot = queue_sql.free_slot(item, now)
        if slot is None:
            raise LeaseLost(
                "Your lease on this item expired and other annotators have since given it all its labels, "
                "so this label was not stored. Your next item is ready."
            )
        assignment.slot = slot
        QueueItem.objects.filter(pk=item.pk).update(completed_count=F("completed_count") + 1)
    assignment.status = AssignmentStatus.DONE
    assignment.finished_at = now
    queue_sql.save_finished(assignment, now)
    return assignment


def insert_counted(rows: Rows, label, assignment: Assignment, *, now: datetime | None = None) -> bool:
    """On PostgreSQL, in one statement: insert the new `label` (an instance of `rows`' model) and count it towards
    its item as `complete` would, if `assignment`'s lease is live and no unique index refuses the label. One
    statement is its own transaction, so this saves the transaction's BEGIN and COMMIT as well as a statement on the
    annotators' busiest request. Returns whether it did; when it did not, nothing was written, and the caller takes
    the transactional path, which handles every other case (an expired lease, a retried submit, a revision)."""
    now = now or timezone.now()
    if not queue_sql.insert_counted(rows, label, assignment, now):
        return False
    assignment.status, assignment.finished_at = AssignmentStatus.DONE, now
    return True
