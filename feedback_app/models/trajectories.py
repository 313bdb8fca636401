from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from feedback_app.models.locations import LocationError, check_endpoint_url, check_model_path
from reward_models.conversation import Message, StepTurn, trajectory_messages


class NotReplayable(ValidationError):
    """The environment cannot rebuild this trajectory's episode: it can be labelled and critiqued, not continued."""


class TaskSplit(models.TextChoices):
    TRAIN = "train", "Training"
    REVIEW = "review", "Review (rolled out for annotators)"
    EVAL = "eval", "Held-out evaluation"


class Task(models.Model):
    """One episode's instruction and seed. The environment rebuilds the same episode from `spec`."""

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="tasks")
    instruction = models.TextField()
    seed = models.BigIntegerField(null=True, blank=True)
    spec = models.JSONField(default=dict, blank=True, help_text="The task dict the environment's reset() takes.")
    split = models.CharField(max_length=8, choices=TaskSplit.choices, default=TaskSplit.TRAIN)
    external_id = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "seed"], condition=Q(seed__isnull=False), name="task_unique_seed_per_project"
            ),
            models.UniqueConstraint(
                fields=["project", "external_id"],
                condition=Q(external_id__isnull=False),
                name="task_unique_external_id_per_project",
            ),
            models.CheckConstraint(condition=Q(split__in=TaskSplit.values), name="task_valid_split"),
        ]
        indexes = [models.Index(fields=["project", "split"])]

    def __str__(self) -> str:
        return f"task {self.pk} (seed {self.seed})" if self.seed is not None else f"task {self.pk}"

    @property
    def is_replayable(self) -> bool:
        return bool(self.spec) or self.seed is not None

    def reset_spec(self) -> dict[str, Any]:
        """The task dict the environment's reset() takes: the stored spec, with the task's seed and instruction
        where the spec leaves them out (policies read the instruction from it). `NotReplayable` for a task imported
        with neither."""
        if not self.is_replayable:
            raise NotReplayable(
                {
                    "trajectory": "This trajectory was imported without its task's seed or spec, so the environment "
                    "cannot replay it and it cannot be continued. You can still label its steps and critique it."
                }
            )
        defaults: dict[str, Any] = {"instruction": self.instruction}
        if self.seed is not None:
            defaults["seed"] = self.seed
        return {**defaults, **self.spec}


class PolicyKind(models.TextChoices):
    LOCAL = "local", "Hugging Face causal-LM directory"
    ENDPOINT = "endpoint", "OpenAI-compatible endpoint"
    EXTERNAL = "external", "External agent (imported trajectories only)"


class PolicyVersion(models.Model):
    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="policy_versions")
    name = models.CharField(max_length=120)
    kind = models.CharField(max_length=16, choices=PolicyKind.choices, default=PolicyKind.LOCAL)
    weights_path = models.CharField(max_length=500, blank=True, help_text="A causal-LM directory, loaded offline.")
    endpoint_url = models.URLField(
        blank=True, help_text="Base URL of an OpenAI-compatible API, e.g. http://vllm:8000/v1"
    )
    endpoint_model = models.CharField(max_length=200, blank=True)
    generation = models.JSONField(default=dict, blank=True, help_text="Generation defaults, e.g. temperature.")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    produced_by = models.ForeignKey(
        "feedback_app.TrainingRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="produced_policies",
        help_text="The training run that made this version.",
    )
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="policy_unique_name_per_project"),
            models.CheckConstraint(condition=Q(kind__in=PolicyKind.values), name="policy_valid_kind"),
            models.CheckConstraint(
                condition=~Q(kind=PolicyKind.LOCAL) | ~Q(weights_path=""), name="policy_local_needs_weights"
            ),
            models.CheckConstraint(
                condition=~Q(kind=PolicyKind.ENDPOINT) | ~Q(endpoint_url=""), name="policy_endpoint_needs_url"
            ),
            models.CheckConstraint(condition=~Q(parent=models.F("id")), name="policy_not_own_parent"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.kind == PolicyKind.LOCAL and not self.weights_path:
            raise ValidationError({"weights_path": "A local policy needs a model directory."})
        if self.kind == PolicyKind.ENDPOINT and not self.endpoint_url:
            raise ValidationError({"endpoint_url": "An endpoint policy needs the endpoint's base URL."})
        if self.parent_id and self.parent.project_id != self.project_id:
            raise ValidationError({"parent": "The parent must belong to the same project."})
        errors = self.location_errors()
        if errors:
            raise ValidationError(errors)

    def location_errors(self) -> dict[str, str]:
        """Why this version's weights path or endpoint URL is not one its project may use (models.locations)."""
        errors = {}
        try:
            if self.kind == PolicyKind.LOCAL and self.weights_path:
                check_model_path(self.project_id, self.weights_path)
        except LocationError as exc:
            errors["weights_path"] = str(exc)
        try:
            if self.kind == PolicyKind.ENDPOINT and self.endpoint_url:
                check_endpoint_url(self.endpoint_url)
        except LocationError as exc:
            errors["endpoint_url"] = str(exc)
        return errors

    def policy_spec(self) -> dict:
        """What `reward_models.policy.load_policy` takes to run this version. The location is checked again here,
        where it is used: a stored row that predates a check, or a symlink changed since, does not get through."""
        if self.kind == PolicyKind.LOCAL:
            return {"kind": "local", "path": check_model_path(self.project_id, self.weights_path)}
        if self.kind == PolicyKind.ENDPOINT:
            check_endpoint_url(self.endpoint_url)
            return {"kind": "endpoint", "base_url": self.endpoint_url, "model": self.endpoint_model}
        raise ValueError(f"Policy version {self.name!r} is external: Tandem cannot run it, only import from it.")

    def lineage(self) -> list[PolicyVersion]:
        """This version and its ancestors, newest first."""
        chain, node = [], self
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain


class TrajectorySource(models.TextChoices):
    POLICY = "policy", "Policy rollout"
    HUMAN = "human", "Human (takeover or demonstration)"
    IMPORT = "import", "Imported"


# Trajectories per query when reading conversations: well under PostgreSQL's 65,535 bind parameters, however many
# trajectories a caller asks for.
CONVERSATIONS_PER_QUERY = 10_000


class TrajectoryQuerySet(models.QuerySet):
    def conversations(self, ids: Iterable[int]) -> dict[int, list[Message]]:
        """The chat messages of the trajectories `ids` among these, by id (`reward_models.conversation`: the prompt,
        then every step's assistant message and the replies that came back), two queries per
        `CONVERSATIONS_PER_QUERY` trajectories. Exports fetch theirs through `feedback_app.exports.conversation`,
        which also keeps each message's JSON."""
        wanted = list(dict.fromkeys(ids))
        found: dict[int, list[Message]] = {}
        for start in range(0, len(wanted), CONVERSATIONS_PER_QUERY):
            chunk = wanted[start : start + CONVERSATIONS_PER_QUERY]
            prompts = dict(self.filter(pk__in=chunk).order_by().values_list("id", "prompt"))
            steps: dict[int, list[StepTurn]] = {pk: [] for pk in prompts}
            rows = Step.objects.filter(trajectory_id__in=list(prompts)).order_by("trajectory_id", "index")
            for trajectory_id, message, replies in rows.values_list("trajectory_id", "message", "replies"):
                steps[trajectory_id].append(StepTurn(message, replies))
            found.update({pk: trajectory_messages(prompt, steps[pk]) for pk, prompt in prompts.items()})
        return found


class Trajectory(models.Model):
    """One episode. A node in a tree: an intervention branches a child off its parent at `branch_step_index`.

    A child stores its whole step list (the shared prefix is copied), so every trajectory reads and exports on its
    own. The outcome fields are hidden from annotators: only researchers, evaluation and simulated annotators read
    them.
    """

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="trajectories")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="trajectories")
    policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="trajectories"
    )
    source = models.CharField(max_length=8, choices=TrajectorySource.choices, default=TrajectorySource.POLICY)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="branches")
    branch_step_index = models.PositiveIntegerField(null=True, blank=True)
    rollout_run = models.ForeignKey(
        "feedback_app.TrainingRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="trajectories"
    )
    sample_index = models.PositiveIntegerField(default=0)
    external_id = models.CharField(max_length=255, null=True, blank=True)
    num_steps = models.PositiveIntegerField(default=0)
    total_env_reward = models.FloatField(default=0.0)
    # Hidden outcome: never shown to annotators.
    success = models.BooleanField(null=True, blank=True)
    outcome_return = models.FloatField(null=True, blank=True)
    oracle = models.JSONField(default=dict, blank=True, help_text="Hidden oracle facts, e.g. per-step correctness.")
    metadata = models.JSONField(default=dict, blank=True)
    # The turn contract (reward_models/conversation.py): the messages before the agent's first turn, verbatim, and
    # the tool schemas the agent was offered (OpenAI's {"type": "function", "function": {...}} form).
    prompt = models.JSONField(default=list, blank=True, help_text="The messages before the agent's first turn.")
    tools = models.JSONField(default=list, blank=True, help_text="The tool schemas the agent was offered.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TrajectoryQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "trajectories"
        constraints = [
            models.UniqueConstraint(
                fields=["project", "external_id"],
                condition=Q(external_id__isnull=False),
                name="trajectory_unique_external_id_per_project",
            ),
            # A rollout run writes each (task, sample) once, which makes a retried run idempotent.
            models.UniqueConstraint(
                fields=["rollout_run", "task", "sample_index"],
                condition=Q(rollout_run__isnull=False),
                name="trajectory_unique_sample_per_rollout",
            ),
            models.CheckConstraint(condition=Q(source__in=TrajectorySource.values), name="trajectory_valid_source"),
            models.CheckConstraint(
                condition=Q(parent__isnull=True, branch_step_index__isnull=True)
                | Q(parent__isnull=False, branch_step_index__isnull=False),
                name="trajectory_branch_needs_parent_and_step",
            ),
            models.CheckConstraint(
                condition=~Q(source=TrajectorySource.POLICY) | Q(policy_version__isnull=False),
                name="trajectory_policy_source_needs_version",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "policy_version"]),
            models.Index(fields=["project", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"trajectory {self.pk}"

    def clean(self) -> None:
        if self.task_id and self.task.project_id != self.project_id:
            raise ValidationError({"task": "The task belongs to another project."})
        if self.parent_id and self.parent.task_id != self.task_id:
            raise ValidationError({"parent": "A branch must continue the same task as its parent."})
        if self.policy_version_id and self.policy_version.project_id != self.project_id:
            raise ValidationError({"policy_version": "The policy version belongs to another project."})


class Step(models.Model):
    """One turn of the agent, verbatim: the assistant `message` it produced (its content and OpenAI-style
    `tool_calls` as it wrote them; for a local policy, the decoded text of `token_ids`) and the `replies` that came
    back (tool messages, or a user message with the next observation). `reward_models.conversation` turns a
    trajectory's prompt and steps into its chat messages; every export and trainer reads them from there.

    `observation` (the text the agent acted on), `reasoning`, `action` (what the environment did) and `tool_calls`
    (the calls read from the message) are the same turn as the annotator pages show it and the environment played
    it; nothing downstream rebuilds a turn from them."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    message = models.JSONField(default=dict, blank=True, help_text="The assistant message, verbatim.")
    replies = models.JSONField(default=list, blank=True, help_text="The messages that came back after it.")
    token_ids = models.JSONField(null=True, blank=True, help_text="The generated token ids, for a local policy.")
    observation = models.TextField(blank=True)
    reasoning = models.TextField(blank=True)
    action = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    env_reward = models.FloatField(default=0.0)
    logprob = models.FloatField(null=True, blank=True)
    media = models.JSONField(default=list, blank=True, help_text="References to images or files shown with the step.")
    render = models.JSONField(default=dict, blank=True, help_text="What the environment's render() gave for the UI.")
    done = models.BooleanField(default=False)

    class Meta:
        ordering = ["trajectory", "index"]
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "index"], name="step_unique_index_per_trajectory"),
        ]

    def __str__(self) -> str:
        return f"step {self.index} of trajectory {self.trajectory_id}"
