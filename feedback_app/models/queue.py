"""What annotators are asked to label, and who holds which slot.

A QueueItem needs `overlap` labels from different annotators. Each Assignment takes one numbered slot; the partial
unique index on (item, slot) over live assignments means two annotators asking at the same moment can never both
take the same slot, whatever the database interleaving, and an expired lease frees its slot for the pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from feedback_app.models.labels import LabelKind

if TYPE_CHECKING:
    from feedback_app.models.projects import Project
    from feedback_app.models.trajectories import Trajectory


class QueueItemManager(models.Manager):
    """Putting work in the queue. Taking it out (leases, skips, completion) is `feedback_app.queue`'s."""

    def enqueue_comparisons(
        self,
        project: Project,
        pairs: Iterable[tuple[Trajectory, Trajectory]],
        *,
        priority: int = 0,
        query_strategy: str = "random",
        overlap: int | None = None,
    ) -> list[QueueItem]:
        """Queue comparisons of trajectory pairs (same task), in canonical order; a pair already queued is
        skipped."""
        wanted: dict[tuple[int, int], tuple[Trajectory, Trajectory]] = {}
        for one, other in pairs:
            if one.task_id != other.task_id:
                raise ValueError(f"pairs: trajectories {one.pk} and {other.pk} are of different tasks")
            if one.pk == other.pk:
                raise ValueError(f"pairs: trajectory {one.pk} is paired with itself")
            low, high = sorted((one, other), key=lambda t: t.pk)
            wanted[(low.pk, high.pk)] = (low, high)
        existing = set(
            self.filter(project=project, kind=LabelKind.COMPARISON, is_gold=False).values_list(
                "trajectory_id", "other_trajectory_id"
            )
        )
        items = [
            self.model(
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
        return self.bulk_create(items, batch_size=1000)

    def enqueue_trajectories(
        self,
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
            self.filter(
                project=project, kind=kind, is_gold=False, trajectory__in=[t.pk for t in trajectories]
            ).values_list("trajectory_id", flat=True)
        )
        items = [
            self.model(
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
        return self.bulk_create(items, batch_size=1000)


def pairs_within_tasks(trajectories: Iterable[Trajectory]) -> list[tuple[Trajectory, Trajectory]]:
    """Every pair of trajectories that share a task, in id order: the simplest comparison queue."""
    by_task: dict[int, list[Trajectory]] = {}
    for trajectory in sorted(trajectories, key=lambda t: t.pk):
        by_task.setdefault(trajectory.task_id, []).append(trajectory)
    return [(a, b) for group in by_task.values() for i, a in enumerate(group) for b in group[i + 1 :]]


class QueueItem(models.Model):
    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="queue_items")
    kind = models.CharField(max_length=16, choices=LabelKind.choices)
    trajectory = models.ForeignKey("feedback_app.Trajectory", on_delete=models.CASCADE, related_name="+")
    other_trajectory = models.ForeignKey(
        "feedback_app.Trajectory",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="The second trajectory of a comparison.",
    )
    priority = models.IntegerField(default=0, help_text="Higher first.")
    overlap = models.PositiveSmallIntegerField(default=1)
    is_gold = models.BooleanField(default=False)
    gold_answer = models.JSONField(null=True, blank=True, help_text="The known answer of a gold item.")
    query_strategy = models.CharField(max_length=32, blank=True)
    completed_count = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = QueueItemManager()

    class Meta:
        ordering = ["-priority", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=LabelKind.values), name="queueitem_valid_kind"),
            models.CheckConstraint(condition=Q(overlap__gte=1), name="queueitem_overlap_positive"),
            models.CheckConstraint(
                condition=~Q(kind=LabelKind.COMPARISON) | Q(other_trajectory__isnull=False),
                name="queueitem_comparison_has_pair",
            ),
            models.CheckConstraint(
                condition=Q(other_trajectory__isnull=True) | ~Q(other_trajectory=F("trajectory")),
                name="queueitem_pair_distinct",
            ),
            models.CheckConstraint(
                condition=Q(is_gold=False) | Q(gold_answer__isnull=False), name="queueitem_gold_has_answer"
            ),
            models.CheckConstraint(condition=Q(completed_count__lte=F("overlap")), name="queueitem_not_overfilled"),
        ]
        indexes = [
            models.Index(fields=["project", "kind", "-priority", "id"]),
            # The queue's next item is the first open one in this order, looked for among gold items or the others:
            # without the condition every request walks past all the items already labelled, and without is_gold a
            # look for gold items (a tenth of requests by default) walks past every open item when none is gold.
            models.Index(
                fields=["project", "kind", "is_gold", "-priority", "id"],
                condition=Q(completed_count__lt=F("overlap")),
                name="queueitem_open_in_order",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} item {self.pk}"

    def clean(self) -> None:
        if self.kind == LabelKind.COMPARISON and self.other_trajectory_id:
            if self.trajectory.task_id != self.other_trajectory.task_id:
                raise ValidationError({"other_trajectory": "A comparison pairs two trajectories of the same task."})


class AssignmentStatus(models.TextChoices):
    LEASED = "leased", "Leased"
    DONE = "done", "Labelled"
    SKIPPED = "skipped", "Skipped"
    EXPIRED = "expired", "Lease expired"


LIVE_STATUSES = (AssignmentStatus.LEASED, AssignmentStatus.DONE)


class Assignment(models.Model):
    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assignments")
    slot = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=8, choices=AssignmentStatus.choices, default=AssignmentStatus.LEASED)
    leased_until = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    skip_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # An annotator never gets the same item twice.
            models.UniqueConstraint(fields=["item", "annotator"], name="assignment_once_per_annotator"),
            models.UniqueConstraint(
                fields=["item", "slot"], condition=Q(status__in=LIVE_STATUSES), name="assignment_one_live_per_slot"
            ),
            models.CheckConstraint(condition=Q(status__in=AssignmentStatus.values), name="assignment_valid_status"),
        ]
        indexes = [models.Index(fields=["annotator", "status"])]

    def __str__(self) -> str:
        return f"{self.annotator} · {self.item} · slot {self.slot}"

    def lease_is_live(self, now: datetime) -> bool:
        """Whether this is a lease that still holds its slot at `now` (a label on it counts at once)."""
        return self.status == AssignmentStatus.LEASED and self.leased_until >= now
