"""Labels are append-only. An edit writes a new revision that supersedes the old one; nothing is overwritten.

`is_current` marks the head of each revision chain. A partial unique index keeps at most one current label per
annotator and item, and another keeps a chain from forking, so a bad history cannot be written even from a shell.
The only column that ever changes on a stored label is `is_current`, flipped in the same transaction that inserts
the next revision.
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import F, Q


class LabelKind(models.TextChoices):
    COMPARISON = "comparison", "Comparison"
    STEP_LABEL = "step_label", "Step label"
    CRITIQUE = "critique", "Critique"
    RATING = "rating", "Rating"
    INTERVENTION = "intervention", "Intervention"


class StaleRevision(Exception):
    """The label being edited has already been superseded by another revision."""


class LabelBase(models.Model):
    # The fields that identify what is labelled (one current label per annotator and item) and the fields that
    # carry the judgement (copied, then changed, by revise()).
    item_fields: ClassVar[tuple[str, ...]] = ()
    content_fields: ClassVar[tuple[str, ...]] = ()

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="+")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    assignment = models.ForeignKey(
        "feedback_app.Assignment", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revision = models.PositiveIntegerField(default=1)
    supersedes = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    is_current = models.BooleanField(default=True)
    # Sent by the client with each submit; a retried or double-clicked submit carries the same token and is stored
    # once.
    client_token = models.UUIDField(null=True, blank=True)
    seconds_spent = models.FloatField(null=True, blank=True)
    query_strategy = models.CharField(max_length=32, blank=True, help_text="How the item was chosen for the queue.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["annotator", "client_token"],
                condition=Q(client_token__isnull=False),
                name="%(class)s_unique_client_token",
            ),
            models.UniqueConstraint(
                fields=["supersedes"], condition=Q(supersedes__isnull=False), name="%(class)s_chain_no_fork"
            ),
            models.CheckConstraint(
                condition=Q(revision=1, supersedes__isnull=True) | Q(revision__gt=1, supersedes__isnull=False),
                name="%(class)s_revision_matches_chain",
            ),
            models.CheckConstraint(
                condition=Q(seconds_spent__isnull=True) | Q(seconds_spent__gte=0), name="%(class)s_seconds_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self._meta.verbose_name} {self.pk} r{self.revision} by {self.annotator_id}"

    def save(self, *args, **kwargs) -> None:
        update_fields = kwargs.get("update_fields")
        if self.pk and not self._state.adding and set(update_fields or ()) != {"is_current"}:
            raise ValidationError("Labels are append-only: call revise() to change one.")
        super().save(*args, **kwargs)

    def revise(self, **changes) -> LabelBase:
        """Store a new revision with `changes` applied and make it the current one. Returns the new row."""
        unknown = set(changes) - set(self.content_fields) - {"seconds_spent", "client_token", "assignment"}
        if unknown:
            raise ValueError(f"Cannot revise {sorted(unknown)} of a {type(self).__name__}.")
        model = type(self)
        with transaction.atomic():
            head = model.objects.select_for_update().get(pk=self.pk)
            if not head.is_current:
                raise StaleRevision(f"{model.__name__} {self.pk} was already revised.")
            model.objects.filter(pk=head.pk).update(is_current=False)
            values = {name: getattr(head, name) for name in (*self.item_fields, *self.content_fields)}
            values["assignment"] = head.assignment
            values.update(changes)
            new = model(
                project_id=head.project_id,
                annotator_id=head.annotator_id,
                revision=head.revision + 1,
                supersedes=head,
                query_strategy=head.query_strategy,
                **values,
            )
            new.full_clean(exclude=["supersedes", "assignment"])
            new.save()
        return new

    def history(self) -> list[LabelBase]:
        """Every revision of this label, oldest first."""
        chain, node = [], self
        while node is not None:
            chain.append(node)
            node = node.supersedes
        return chain[::-1]


def _one_current(model_name: str, *fields: str) -> models.UniqueConstraint:
    return models.UniqueConstraint(
        fields=["annotator", *fields], condition=Q(is_current=True), name=f"{model_name}_one_current_per_item"
    )


class ComparisonChoice(models.TextChoices):
    A = "a", "A is better"
    B = "b", "B is better"
    TIE = "tie", "Tie"
    BOTH_BAD = "both_bad", "Both bad"


class Comparison(LabelBase):
    """A preference between two trajectories of the same task. a/b are stored in canonical order (a.id < b.id);
    `displayed_order` records which one the annotator saw on the left."""

    item_fields = ("trajectory_a", "trajectory_b", "displayed_order")
    content_fields = ("choice", "strength", "rationale")

    trajectory_a = models.ForeignKey("feedback_app.Trajectory", on_delete=models.CASCADE, related_name="+")
    trajectory_b = models.ForeignKey("feedback_app.Trajectory", on_delete=models.CASCADE, related_name="+")
    choice = models.CharField(max_length=8, choices=ComparisonChoice.choices)
    strength = models.PositiveSmallIntegerField(
        null=True, blank=True, default=2, help_text="1 slight, 2 clear, 3 decisive; none for a tie or both bad."
    )
    rationale = models.TextField(blank=True)
    displayed_order = models.CharField(max_length=2, choices=[("ab", "A left"), ("ba", "B left")], default="ab")

    class Meta(LabelBase.Meta):
        constraints = [
            *LabelBase.Meta.constraints,
            _one_current("comparison", "trajectory_a", "trajectory_b"),
            models.CheckConstraint(condition=Q(trajectory_a__lt=F("trajectory_b")), name="comparison_canonical_order"),
            models.CheckConstraint(condition=Q(choice__in=ComparisonChoice.values), name="comparison_valid_choice"),
            models.CheckConstraint(
                condition=Q(strength__isnull=True) | Q(strength__gte=1, strength__lte=3),
                name="comparison_strength_1_to_3",
            ),
            models.CheckConstraint(condition=Q(displayed_order__in=["ab", "ba"]), name="comparison_valid_order"),
        ]

    def save(self, *args, **kwargs) -> None:
        self.strength = self.strength_for(self.choice, self.strength)
        super().save(*args, **kwargs)

    @staticmethod
    def strength_for(choice: str, strength: int | None) -> int | None:
        """The strength stored with `choice`: none for a tie or both bad, which prefer neither side; a preference
        without one is clear (2)."""
        if choice in (ComparisonChoice.TIE, ComparisonChoice.BOTH_BAD):
            return None
        return 2 if strength is None else strength

    def clean(self) -> None:
        if self.trajectory_a_id and self.trajectory_b_id:
            if self.trajectory_a_id == self.trajectory_b_id:
                raise ValidationError({"trajectory_b": "A trajectory cannot be compared with itself."})
            if self.trajectory_a.task_id != self.trajectory_b.task_id:
                raise ValidationError({"trajectory_b": "Both trajectories must be of the same task."})


class StepLabelValue(models.IntegerChoices):
    GOOD = 1, "+1 good"
    NEUTRAL = 0, "0 neutral"
    BAD = -1, "-1 bad"


class StepLabel(LabelBase):
    item_fields = ("step",)
    content_fields = ("value",)

    step = models.ForeignKey("feedback_app.Step", on_delete=models.CASCADE, related_name="labels")
    value = models.SmallIntegerField(choices=StepLabelValue.choices)

    class Meta(LabelBase.Meta):
        constraints = [
            *LabelBase.Meta.constraints,
            _one_current("steplabel", "step"),
            models.CheckConstraint(condition=Q(value__in=StepLabelValue.values), name="steplabel_valid_value"),
        ]


class SpanField(models.TextChoices):
    OBSERVATION = "observation", "Observation"
    REASONING = "reasoning", "Reasoning"
    ACTION = "action", "Action"


class Critique(LabelBase):
    """Free text anchored to a whole trajectory, to one step, or to a character span of one field of a step.
    An annotator may write many critiques of one item, so there is no one-current-per-item rule here."""

    item_fields = ("trajectory", "step", "span_field", "span_start", "span_end")
    content_fields = ("text", "tags")

    trajectory = models.ForeignKey("feedback_app.Trajectory", on_delete=models.CASCADE, related_name="critiques")
    step = models.ForeignKey("feedback_app.Step", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    span_field = models.CharField(max_length=12, choices=SpanField.choices, blank=True)
    span_start = models.PositiveIntegerField(null=True, blank=True)
    span_end = models.PositiveIntegerField(null=True, blank=True)
    text = models.TextField()
    tags = models.JSONField(default=list, blank=True)

    class Meta(LabelBase.Meta):
        constraints = [
            *LabelBase.Meta.constraints,
            models.CheckConstraint(
                condition=Q(span_start__isnull=True, span_end__isnull=True, span_field="")
                | Q(step__isnull=False, span_start__isnull=False, span_end__gt=F("span_start")) & ~Q(span_field=""),
                name="critique_span_complete_and_ordered",
            ),
            models.CheckConstraint(condition=~Q(text=""), name="critique_text_not_empty"),
        ]

    def clean(self) -> None:
        if self.step_id and self.step.trajectory_id != self.trajectory_id:
            raise ValidationError({"step": "The step belongs to another trajectory."})
        if self.span_start is not None or self.span_end is not None:
            if self.step_id is None or not self.span_field:
                raise ValidationError({"span_start": "A span needs a step and the field it lies in."})
            text = getattr(self.step, self.span_field)
            if not (0 <= self.span_start < (self.span_end or 0) <= len(text)):
                raise ValidationError(
                    {
                        "span_end": f"Span {self.span_start}..{self.span_end} lies outside the {len(text)} characters "
                        f"of the step's {self.span_field}."
                    }
                )
        if not isinstance(self.tags, list) or not all(isinstance(tag, str) for tag in self.tags):
            raise ValidationError({"tags": "Tags must be a list of strings."})


class Rating(LabelBase):
    """A trajectory-level judgement: a 1–5 score, a thumb, or both (KTO-style unpaired feedback)."""

    item_fields = ("trajectory",)
    content_fields = ("score", "thumb_up", "comment")

    trajectory = models.ForeignKey("feedback_app.Trajectory", on_delete=models.CASCADE, related_name="ratings")
    score = models.PositiveSmallIntegerField(null=True, blank=True)
    thumb_up = models.BooleanField(null=True, blank=True)
    comment = models.TextField(blank=True)

    class Meta(LabelBase.Meta):
        constraints = [
            *LabelBase.Meta.constraints,
            _one_current("rating", "trajectory"),
            models.CheckConstraint(
                condition=Q(score__isnull=True) | Q(score__gte=1, score__lte=5), name="rating_score_1_to_5"
            ),
            models.CheckConstraint(
                condition=Q(score__isnull=False) | Q(thumb_up__isnull=False), name="rating_has_score_or_thumb"
            ),
        ]


class InterventionStatus(models.TextChoices):
    PENDING = "pending", "Waiting for a rollout worker"
    RUNNING = "running", "The policy is continuing"
    DONE = "done", "Continued"
    FAILED = "failed", "Failed"


class Intervention(LabelBase):
    """The annotator replaced the action at `step` (and, in takeover mode, played further steps by hand); the
    policy continues from the corrected prefix in `child_trajectory`."""

    # The original step is part of what is labelled: a revision keeps it.
    item_fields = ("trajectory", "step", "original_action", "original_reasoning", "original_message")
    content_fields = ("corrected_action", "corrected_reasoning", "corrected_message", "takeover_actions", "reason")

    trajectory = models.ForeignKey("feedback_app.Trajectory", on_delete=models.CASCADE, related_name="interventions")
    step = models.ForeignKey("feedback_app.Step", on_delete=models.CASCADE, related_name="interventions")
    # The step's assistant message and the annotator's, verbatim (reward_models/conversation.py): what the exports
    # pair. The action and reasoning fields are the same turns as the pages show them.
    original_message = models.JSONField(default=dict, blank=True)
    corrected_message = models.JSONField(default=dict, blank=True)
    original_action = models.TextField()
    original_reasoning = models.TextField(blank=True)
    corrected_action = models.TextField()
    corrected_reasoning = models.TextField(blank=True)
    takeover_actions = models.JSONField(
        default=list, blank=True, help_text="Further turns played by hand: actions, or assistant messages."
    )
    reason = models.TextField(blank=True)
    child_trajectory = models.ForeignKey(
        "feedback_app.Trajectory", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=8, choices=InterventionStatus.choices, default=InterventionStatus.PENDING)
    error = models.TextField(blank=True)

    class Meta(LabelBase.Meta):
        constraints = [
            *LabelBase.Meta.constraints,
            _one_current("intervention", "step"),
            models.CheckConstraint(condition=~Q(corrected_action=""), name="intervention_has_correction"),
            models.CheckConstraint(
                condition=Q(status__in=InterventionStatus.values), name="intervention_valid_status"
            ),
        ]

    def save(self, *args, **kwargs) -> None:
        # The continuation's progress is bookkeeping, not judgement: the worker may update it in place.
        update_fields = set(kwargs.get("update_fields") or ())
        if self.pk and update_fields and update_fields <= {"status", "child_trajectory", "error"}:
            models.Model.save(self, *args, **kwargs)
            return
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if self.step_id and self.step.trajectory_id != self.trajectory_id:
            raise ValidationError({"step": "The step belongs to another trajectory."})
        turns = self.takeover_actions
        if not isinstance(turns, list) or not all(isinstance(turn, str | dict) for turn in turns):
            raise ValidationError({"takeover_actions": "Must be a list of actions or assistant messages."})
