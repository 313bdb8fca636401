from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils.text import slugify


class FeedbackKind(models.TextChoices):
    COMPARISON = "comparison", "Trajectory comparison"
    STEP_LABEL = "step_label", "Step labels"
    CRITIQUE = "critique", "Critique"
    RATING = "rating", "Rating"
    INTERVENTION = "intervention", "Intervention"


def default_feedback_kinds() -> list[str]:
    return [kind.value for kind in FeedbackKind]


def default_lease_minutes() -> int:
    return settings.TANDEM_DEFAULT_LEASE_MINUTES


class QueryStrategy(models.TextChoices):
    """How comparison pairs are picked for the queue (training.selection), recorded on every item and label."""

    RANDOM = "random", "Random pairs"
    DISAGREEMENT = "disagreement", "Reward-ensemble disagreement"
    UNCERTAINTY = "uncertainty", "Uncertainty (P(A > B) near 1/2)"
    NEW_VS_PARENT = "new_vs_parent", "New policy version against its parent"


class Role(models.TextChoices):
    ANNOTATOR = "annotator", "Annotator"
    RESEARCHER = "researcher", "Researcher"
    ADMIN = "admin", "Admin"


class EnvironmentSpec(models.Model):
    """Where an environment's code lives (a dotted path to its class) and the config it is built with."""

    name = models.SlugField(max_length=80, unique=True)
    dotted_path = models.CharField(
        max_length=255, help_text="Import path of the environment class, e.g. reward_models.envs.gridworld.GridWorld"
    )
    config = models.JSONField(default=dict, blank=True, help_text="Keyword arguments for the environment class.")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from reward_models.envs import load_environment

        if not isinstance(self.config, dict):
            raise ValidationError({"config": "Must be a JSON object of keyword arguments."})
        try:
            load_environment(self.dotted_path, self.config)
        except (ValueError, TypeError) as exc:
            raise ValidationError({"dotted_path": str(exc)}) from exc

    def load(self):
        """Build a fresh environment instance (environments are stateful: one per episode or batch)."""
        from reward_models.envs import load_environment

        return load_environment(self.dotted_path, self.config)


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80, unique=True)
    description = models.TextField(blank=True)
    guidelines = models.TextField(blank=True, help_text="Markdown shown to annotators.")
    environment = models.ForeignKey(EnvironmentSpec, on_delete=models.PROTECT, related_name="projects")
    feedback_kinds = models.JSONField(default=default_feedback_kinds, help_text="Enabled kinds of feedback.")
    overlap = models.PositiveSmallIntegerField(default=1, help_text="How many different annotators label each item.")
    blind = models.BooleanField(default=True, help_text="Hide policy names and outcomes from annotators.")
    lease_minutes = models.PositiveIntegerField(default=default_lease_minutes)
    gold_fraction = models.FloatField(
        default=0.1, help_text="Share of served items that are gold items, while unanswered gold items remain."
    )
    query_strategy = models.CharField(
        max_length=16,
        choices=QueryStrategy.choices,
        default=QueryStrategy.RANDOM,
        help_text="Which comparison pairs a rollout queues: random; disagreement (where the reward-model ensemble "
        "members disagree most); uncertainty (P(A > B) nearest 1/2); or new_vs_parent (a fresh policy version against "
        "its parent). The two reward-model strategies fall back to random while the project has no reward model.",
    )
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(overlap__gte=1), name="project_overlap_at_least_one"),
            models.CheckConstraint(condition=models.Q(lease_minutes__gte=1), name="project_lease_positive"),
            models.CheckConstraint(
                condition=models.Q(gold_fraction__gte=0, gold_fraction__lte=1), name="project_gold_fraction_0_to_1"
            ),
            models.CheckConstraint(
                condition=models.Q(query_strategy__in=QueryStrategy.values), name="project_valid_query_strategy"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        if not self.slug:
            self.slug = slugify(self.name)[:80]
        super().save(*args, **kwargs)

    def clean(self) -> None:
        valid = set(FeedbackKind.values)
        if not isinstance(self.feedback_kinds, list) or not self.feedback_kinds:
            raise ValidationError({"feedback_kinds": "Give a non-empty list of feedback kinds."})
        unknown = [kind for kind in self.feedback_kinds if kind not in valid]
        if unknown:
            raise ValidationError({"feedback_kinds": f"Unknown kinds {unknown}; choose from {sorted(valid)}."})

    def role_of(self, user) -> str | None:
        if not user.is_authenticated:
            return None
        membership = self.memberships.filter(user=user).only("role").first()
        return membership.role if membership else None


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ANNOTATOR)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_unique_user_project"),
            models.CheckConstraint(condition=models.Q(role__in=Role.values), name="membership_valid_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} · {self.role} · {self.project}"

    @property
    def can_manage(self) -> bool:
        return self.role in (Role.RESEARCHER, Role.ADMIN)
