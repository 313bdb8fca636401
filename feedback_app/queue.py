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

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from feedback_app.models import Assignment, LabelKind, Project, QueueItem, Trajectory
from feedback_app.models.queue import AssignmentStatus

# How many candidates one request reads at once without row locks (SQLite), where a candidate may be taken between
# the read and the insert. With row locks one is enough: a locked row is skipped, not waited for.
CANDIDATES_PER_TRY = 8


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
    """The user's unexpired lease in this project, if any (so a reload resumes the same item)."""
    now = now or timezone.now()
    leases = Assignment.objects.filter(
        item__project=project, annotator=user, status=AssignmentStatus.LEASED, leased_until__gte=now
    )
    if kind:
        leases = leases.filter(item__kind=kind)
    return leases.select_related("item").order_by("created_at").first()


def next_assignment(
    user, project: Project, *, kind: str | None = None, now: datetime | None = None, rng: random.Random | None = None
) -> Assignment | None:
    """Lease the next item for `user`: the current lease if there is one, else the highest-priority open item.

    Gold items are mixed in unannounced: with probability `project.gold_fraction` a gold item is preferred, while
    the user has gold items left. Returns None when nothing is left for this user.
    """
    now = now or timezone.now()
    resumed = current_assignment(project, user, kind=kind, now=now)
    if resumed is not None:
        return resumed
    prefer_gold = (rng or random).random() < project.gold_fraction
    items = open_items(project, user, kind=kind, now=now)
    for gold_first in (prefer_gold, not prefer_gold):
        assignment = _take_one(items.filter(is_gold=gold_first), project, user, now)
        if assignment is not None:
            return assignment
    return None


def _take_one(items: QuerySet, project: Project, user, now: datetime) -> Assignment | None:
    for _ in range(3):
        with transaction.atomic():
            if connection.features.has_select_for_update_skip_locked:
                # When every open item is locked by someone else this very moment, wait for one rather than
                # report an empty queue.
                batch = list(items.select_for_update(skip_locked=True, of=("self",))[:1]) or list(
                    items.select_for_update(of=("self",))[:1]
                )
            else:
                batch = list(items[:CANDIDATES_PER_TRY])
            if not batch:
                return None
            for item in batch:
                slot = _free_slot(item, now)
                if slot is None:
                    continue
                try:
                    with transaction.atomic():
                        return Assignment.objects.create(
                            item=item,
                            annotator=user,
                            slot=slot,
                            leased_until=now + timedelta(minutes=project.lease_minutes),
                        )
                except IntegrityError:
                    # Another request took this slot (or the user's own double request took this item).
                    continue
    return None


def _free_slot(item: QueueItem, now: datetime) -> int | None:
    """Expire stale leases on `item`, then return its lowest free slot. Call with the item locked."""
    held = Assignment.objects.filter(item=item, status__in=(AssignmentStatus.LEASED, AssignmentStatus.DONE))
    rows = list(held.values_list("pk", "slot", "status", "leased_until"))
    stale = {pk for pk, _, status, until in rows if status == AssignmentStatus.LEASED and until < now}
    if stale:  # usually none: one query instead of two on the annotators' busiest path
        Assignment.objects.filter(pk__in=stale).update(status=AssignmentStatus.EXPIRED)
    used = {slot for pk, slot, _, _ in rows if pk not in stale}
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
    caller's transaction rolls back. Completing twice is harmless.
    """
    now = now or timezone.now()
    if assignment.status == AssignmentStatus.DONE:
        return assignment
    if assignment.status == AssignmentStatus.LEASED and assignment.leased_until >= now:
        # A live lease holds its slot, so the item has room: count the label at once. Updating the item first
        # takes its row lock in the same order as _take_one (item, then its assignments).
        QueueItem.objects.filter(pk=assignment.item_id).update(completed_count=F("completed_count") + 1)
    else:
        item = QueueItem.objects.select_for_update().get(pk=assignment.item_id)
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
    assignment.save(update_fields=["slot", "status", "finished_at"])
    return assignment


def expire_leases(*, now: datetime | None = None) -> int:
    """Mark every lease past its time expired (the queue does this lazily too). Returns how many."""
    return Assignment.objects.filter(status=AssignmentStatus.LEASED, leased_until__lt=now or timezone.now()).update(
        status=AssignmentStatus.EXPIRED
    )


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
