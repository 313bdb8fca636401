"""What annotators are asked to label, and who holds which slot.

A QueueItem needs `overlap` labels from different annotators. Each Assignment takes one numbered slot; the partial
unique index on (item, slot) over live assignments means two annotators asking at the same moment can never both
take the same slot, whatever the database interleaving, and an expired lease frees its slot for the pool.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from feedback_app.models.labels import LabelKind


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
