"""Serializers of the REST API's resources. The import row schemas live in feedback_app/serializers.py.

Fields that reveal outcomes (success, returns, rewards, oracle facts) and, in blind projects, which policy made a
trajectory are dropped for annotators by HiddenFieldsMixin; the schema documents them as "researchers and admins
only".
"""

from __future__ import annotations

from django.utils.text import slugify
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from feedback_app.api.base import HiddenFieldsMixin
from feedback_app.api.fields import CheckedJSONField, TandemModelSerializer
from feedback_app.labelling import displayed_order
from feedback_app.models import (
    Assignment,
    Comparison,
    Critique,
    DatasetSnapshot,
    EnvironmentSpec,
    Evaluation,
    FeedbackKind,
    Intervention,
    LabelKind,
    PolicyVersion,
    Project,
    QueueItem,
    Rating,
    RegisteredModel,
    Step,
    StepLabel,
    Task,
    TrainingRun,
    Trajectory,
)
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.trajectories import PolicyKind
from feedback_app.win_rates import human_win_rate
from training import launch

RESEARCHERS_ONLY = " Researchers and admins only: annotators do not get this field."


def _in_project(serializer: serializers.Field, model, project_path: str = "project", **filters):
    """A queryset of `model` limited to the request's project (all rows when building the schema)."""
    project = serializer.context.get("project")
    return model.objects.filter(**{project_path: project}, **filters) if project is not None else model.objects.all()


@extend_schema_field(OpenApiTypes.INT)
class ProjectRelatedField(serializers.PrimaryKeyRelatedField):
    """A primary key that must name a row of the request's project: another project's id reads as "does not
    exist", so ids do not leak across projects."""

    def __init__(self, model=None, project_path: str = "project", **kwargs) -> None:
        self.model = model
        self.project_path = project_path
        super().__init__(**kwargs)

    def get_queryset(self):
        return _in_project(self, self.model, self.project_path)


# --- Projects -----------------------------------------------------------------------------------------------------


class EnvironmentSpecSerializer(TandemModelSerializer):
    class Meta:
        model = EnvironmentSpec
        fields = ["name", "dotted_path", "config"]
        read_only_fields = fields


class ProjectSerializer(TandemModelSerializer):
    environment = serializers.SlugRelatedField(
        slug_field="name", queryset=EnvironmentSpec.objects.all(), help_text="The environment spec's name."
    )
    environment_spec = EnvironmentSpecSerializer(
        source="environment",
        read_only=True,
        help_text="How the environment is built: reward_models.envs.load_environment(dotted_path, config).",
    )
    feedback_kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=FeedbackKind.choices), allow_empty=False, required=False
    )
    role = serializers.SerializerMethodField(help_text="The caller's role in the project.")

    class Meta:
        model = Project
        fields = [
            "id",
            "name",
            "slug",
            "description",
            "guidelines",
            "environment",
            "environment_spec",
            "feedback_kinds",
            "overlap",
            "blind",
            "lease_minutes",
            "gold_fraction",
            "query_strategy",
            "role",
            "created_at",
        ]
        read_only_fields = ["slug", "created_at"]
        extra_kwargs = {
            "overlap": {"min_value": 1},
            "lease_minutes": {"min_value": 1},
            "gold_fraction": {"min_value": 0.0, "max_value": 1.0},
            "query_strategy": {
                "error_messages": {
                    "invalid_choice": '"{input}" is not a query strategy; choose one of '
                    + ", ".join(QueryStrategy.values)
                    + "."
                }
            },
        }

    def get_role(self, project: Project) -> str | None:
        roles = self.context.get("roles") or {}
        return roles.get(project.pk)

    def validate_name(self, value: str) -> str:
        slug = slugify(value)[:80]
        if not slug:
            raise serializers.ValidationError("The name needs at least one letter or digit (it makes the slug).")
        # The slug is made from the name once, on creation.
        if self.instance is None and Project.objects.filter(slug=slug).exists():
            raise serializers.ValidationError(f"A project with the slug {slug!r} already exists.")
        return value


# --- Tasks and policy versions ------------------------------------------------------------------------------------


class TaskSerializer(TandemModelSerializer):
    class Meta:
        model = Task
        fields = ["id", "instruction", "seed", "spec", "split", "external_id", "created_at"]
        read_only_fields = ["created_at"]

    def validate(self, attrs: dict) -> dict:
        for name in ("seed", "external_id"):
            value = attrs.get(name)
            if value is None:
                continue
            clash = _in_project(self, Task, **{name: value})
            if self.instance is not None:
                clash = clash.exclude(pk=self.instance.pk)
            if clash.exists():
                raise serializers.ValidationError({name: f"Another task of this project has {name} {value!r}."})
        return attrs


class WinRateSerializer(serializers.Serializer):
    parent = serializers.IntegerField(help_text="The parent version it was compared against.")
    n = serializers.IntegerField(help_text="Current comparisons of one's trajectory against the other's.")
    wins = serializers.IntegerField()
    losses = serializers.IntegerField()
    ties = serializers.IntegerField(help_text="Ties and 'both bad', each counted half.")
    value = serializers.FloatField(allow_null=True, help_text="The share of comparisons the new version won.")
    low = serializers.FloatField(allow_null=True, help_text="Wilson 95 % interval, lower end.")
    high = serializers.FloatField(allow_null=True, help_text="Wilson 95 % interval, upper end.")


class PolicyVersionSerializer(TandemModelSerializer):
    parent = ProjectRelatedField(model=PolicyVersion, required=False, allow_null=True)
    human_win_rate = serializers.SerializerMethodField(
        help_text="How often annotators preferred this version over its parent (null without a parent)."
    )

    class Meta:
        model = PolicyVersion
        fields = [
            "id",
            "name",
            "kind",
            "weights_path",
            "endpoint_url",
            "endpoint_model",
            "generation",
            "parent",
            "produced_by",
            "notes",
            "created_at",
            "human_win_rate",
        ]
        read_only_fields = ["produced_by", "created_at"]

    @extend_schema_field(WinRateSerializer(allow_null=True))
    def get_human_win_rate(self, version: PolicyVersion) -> dict | None:
        known = self.context.get("win_rates", {})
        return known[version.pk] if version.pk in known else human_win_rate(version)

    def validate(self, attrs: dict) -> dict:
        merged = {
            name: attrs.get(name, getattr(self.instance, name, ""))
            for name in ("kind", "weights_path", "endpoint_url", "name")
        }
        kind = merged["kind"] or PolicyKind.LOCAL
        if kind == PolicyKind.LOCAL and not merged["weights_path"]:
            raise serializers.ValidationError({"weights_path": "A local policy needs a model directory."})
        if kind == PolicyKind.ENDPOINT and not merged["endpoint_url"]:
            raise serializers.ValidationError({"endpoint_url": "An endpoint policy needs the endpoint's base URL."})
        if self.instance is not None and attrs.get("parent") == self.instance:
            raise serializers.ValidationError({"parent": "A policy version cannot be its own parent."})
        project = self.context.get("project")
        if project is not None:
            candidate = PolicyVersion(
                project_id=project.pk,
                kind=kind,
                weights_path=merged["weights_path"],
                endpoint_url=merged["endpoint_url"],
            )
            errors = candidate.location_errors()
            if errors:
                raise serializers.ValidationError(errors)
        clash = _in_project(self, PolicyVersion, name=merged["name"])
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError({"name": "Another policy version of this project has this name."})
        return attrs


# --- Trajectories -------------------------------------------------------------------------------------------------


class TrajectoryStepSerializer(HiddenFieldsMixin, TandemModelSerializer):
    class Meta:
        model = Step
        fields = [
            "id",
            "index",
            "observation",
            "reasoning",
            "action",
            "tool_calls",
            "message",
            "replies",
            "media",
            "render",
            "done",
            "env_reward",
            "logprob",
        ]
        read_only_fields = fields
        outcome_fields = ("env_reward", "logprob")
        extra_kwargs = {
            "env_reward": {"help_text": "The environment's reward for this step." + RESEARCHERS_ONLY},
            "logprob": {"help_text": "The policy's log-probability of the action." + RESEARCHERS_ONLY},
        }


class TrajectorySerializer(HiddenFieldsMixin, TandemModelSerializer):
    policy_name = serializers.CharField(source="policy_version.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Trajectory
        fields = [
            "id",
            "task",
            "source",
            "parent",
            "branch_step_index",
            "sample_index",
            "external_id",
            "num_steps",
            "created_at",
            "policy_version",
            "policy_name",
            "rollout_run",
            "total_env_reward",
            "success",
            "outcome_return",
            "oracle",
            "metadata",
        ]
        read_only_fields = fields
        outcome_fields = ("total_env_reward", "success", "outcome_return", "oracle", "metadata")
        policy_fields = ("policy_version", "policy_name", "rollout_run")
        blind = " In a blind project, researchers and admins only."
        extra_kwargs = {
            "policy_version": {"help_text": "The policy version that produced it." + blind},
            "rollout_run": {"help_text": "The rollout run that produced it." + blind},
            "total_env_reward": {"help_text": "Sum of the steps' environment rewards." + RESEARCHERS_ONLY},
            "success": {"help_text": "Whether the episode succeeded." + RESEARCHERS_ONLY},
            "outcome_return": {"help_text": "The true return." + RESEARCHERS_ONLY},
            "oracle": {"help_text": "Hidden oracle facts, e.g. per-step correctness." + RESEARCHERS_ONLY},
            "metadata": {"help_text": "Free-form facts from the rollout or the import." + RESEARCHERS_ONLY},
        }


class TrajectoryDetailSerializer(TrajectorySerializer):
    steps = TrajectoryStepSerializer(many=True, read_only=True)

    class Meta(TrajectorySerializer.Meta):
        fields = [*TrajectorySerializer.Meta.fields, "steps"]
        read_only_fields = fields


# --- Assignments --------------------------------------------------------------------------------------------------


class QueueItemSerializer(HiddenFieldsMixin, TandemModelSerializer):
    class Meta:
        model = QueueItem
        fields = ["id", "kind", "trajectory", "other_trajectory", "priority", "overlap", "is_gold", "gold_answer"]
        read_only_fields = fields
        # An annotator must not know which items are gold, nor their answers.
        outcome_fields = ("is_gold", "gold_answer")


class AssignmentSerializer(TandemModelSerializer):
    item = QueueItemSerializer(read_only=True)
    annotator_username = serializers.CharField(source="annotator.username", read_only=True)

    class Meta:
        model = Assignment
        fields = [
            "id",
            "item",
            "annotator",
            "annotator_username",
            "slot",
            "status",
            "leased_until",
            "created_at",
            "finished_at",
            "skip_reason",
        ]
        read_only_fields = fields


class NextItemSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=LabelKind.choices,
        required=False,
        allow_null=True,
        help_text="Only items of this kind (default: any kind).",
    )


class LeasedAssignmentSerializer(AssignmentSerializer):
    """An assignment with what a client needs to label its item."""

    kind = serializers.CharField(source="item.kind", read_only=True)
    task = serializers.IntegerField(source="item.trajectory.task_id", read_only=True)
    trajectories = serializers.SerializerMethodField(
        help_text="The item's trajectory ids in the order shown: for a comparison [left, right], randomised per "
        "assignment as on the compare page. Send the left one as trajectory_a with displayed_order 'ab'."
    )
    displayed_order = serializers.SerializerMethodField(
        help_text="For a comparison: 'ab' when the item's first trajectory (the lower id) is shown on the left, "
        "else 'ba'; null for other kinds."
    )

    class Meta(AssignmentSerializer.Meta):
        fields = [*AssignmentSerializer.Meta.fields, "kind", "task", "trajectories", "displayed_order"]
        read_only_fields = fields

    def get_trajectories(self, assignment: Assignment) -> list[int]:
        item = assignment.item
        if item.other_trajectory_id is None:
            return [item.trajectory_id]
        pair = [item.trajectory_id, item.other_trajectory_id]
        return pair if self.get_displayed_order(assignment) == "ab" else pair[::-1]

    @extend_schema_field(
        serializers.ChoiceField(choices=Comparison._meta.get_field("displayed_order").choices, allow_null=True)
    )
    def get_displayed_order(self, assignment: Assignment) -> str | None:
        return displayed_order(assignment) if assignment.item.other_trajectory_id is not None else None


class SkipSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", help_text="Why the item is given back."
    )


# --- Runs and evaluations -----------------------------------------------------------------------------------------


class TrainingRunSerializer(TandemModelSerializer):
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who launched it (null for the system)."
    )
    progress_fraction = serializers.FloatField(read_only=True)
    eta_seconds = serializers.SerializerMethodField(help_text="Estimated seconds left while running, else null.")

    class Meta:
        model = TrainingRun
        fields = [
            "id",
            "kind",
            "status",
            "config",
            "snapshot",
            "base_policy",
            "inputs",
            "progress_current",
            "progress_total",
            "progress_phase",
            "progress_fraction",
            "eta_seconds",
            "metrics",
            "summary",
            "log",
            "artifact_dir",
            "error",
            "cancel_requested",
            "attempts",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_eta_seconds(self, run: TrainingRun) -> float | None:
        eta = run.eta
        return round(eta.total_seconds(), 1) if eta is not None else None


class RolloutLaunchSerializer(serializers.Serializer):
    """Launch a rollout run: the policy version plays tasks and the trajectories come back for review."""

    kind = serializers.ChoiceField(choices=["rollout"], default="rollout", help_text="Only rollout runs for now.")
    policy_version = ProjectRelatedField(model=PolicyVersion)
    config = serializers.DictField(
        required=False,
        default=dict,
        help_text="Rollout settings: task_ids, split, num_tasks, samples_per_task, greedy, temperature, seed, "
        "max_turns, compare_with_parent, review_priority, queue_comparisons (pairs to queue by the project's query "
        "strategy), queue_step_labels (training.rollouts.RolloutConfig).",
    )

    def validate(self, attrs: dict) -> dict:
        try:
            attrs["rollout_config"] = launch.RolloutConfig.from_dict(attrs["config"])
        except (TypeError, ValueError) as exc:
            raise serializers.ValidationError({"config": str(exc)}) from None
        if attrs["policy_version"].kind == PolicyKind.EXTERNAL:
            raise serializers.ValidationError(
                {"policy_version": "An external policy cannot be rolled out by Tandem; import its trajectories."}
            )
        location = attrs["policy_version"].location_errors()
        if location:
            raise serializers.ValidationError({"policy_version": next(iter(location.values()))})
        return attrs


class JudgeLaunchSerializer(serializers.Serializer):
    """Launch a judge-model run on a dataset snapshot: reward_model (preference snapshots), prm (stepwise),
    value_critic (returns), generative_critic (critiques) or preference_model (preference; pairwise, for Nash-MD
    and SPO)."""

    kind = serializers.ChoiceField(
        choices=["reward_model", "prm", "value_critic", "generative_critic", "preference_model"]
    )
    snapshot = ProjectRelatedField(model=DatasetSnapshot, help_text="The frozen data it trains on.")
    base_policy = ProjectRelatedField(
        model=PolicyVersion,
        required=False,
        allow_null=True,
        help_text="A local policy version whose weights the model starts from (default: the project's newest).",
    )
    base_model = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="Instead of base_policy: any Hugging Face model directory the workers can read.",
    )
    judges = serializers.DictField(
        child=ProjectRelatedField(model=RegisteredModel),
        required=False,
        default=dict,
        help_text="Registered judge models a run uses, by setting: value_critic takes reward_model and prm.",
    )
    config = serializers.DictField(
        required=False,
        default=dict,
        help_text="Pipeline settings (see `python -m reward_models.<pipeline> --help`), e.g. learning_rate, "
        "num_epochs, batch_size, ensemble_size; `name` names the registered model.",
    )


class PolicyLaunchSerializer(serializers.Serializer):
    """Launch a policy fine-tuning run: dpo (step_preference or preference snapshots), kto (unpaired), sft (sft),
    or ppo, nash_md, spo, grpo (online, from registered judge models)."""

    kind = serializers.ChoiceField(choices=["dpo", "kto", "sft", "ppo", "nash_md", "spo", "grpo"])
    base_policy = ProjectRelatedField(
        model=PolicyVersion,
        required=False,
        allow_null=True,
        help_text="The local policy version to fine-tune (default: the project's newest); the new version's parent.",
    )
    snapshot = ProjectRelatedField(
        model=DatasetSnapshot,
        required=False,
        allow_null=True,
        help_text="The frozen labels dpo, kto and sft learn from.",
    )
    judges = serializers.DictField(
        child=ProjectRelatedField(model=RegisteredModel),
        required=False,
        default=dict,
        help_text="Registered judge models by setting: ppo takes reward_model_path, prm_path, value_critic_path; "
        "nash_md and spo take preference_model_path (a preference model or a reward model); grpo takes "
        "reward_model_path.",
    )
    config = serializers.DictField(
        required=False,
        default=dict,
        help_text="Trainer settings (see `python -m reward_models.finetune.<trainer> --help`), e.g. learning_rate, "
        "max_steps, beta; `name` names the new policy version.",
    )
    review = serializers.DictField(
        required=False,
        default=dict,
        help_text="What happens on success: enabled (default true) rolls the new version out on num_tasks review "
        "tasks (16) × samples_per_task (1) and queues blind comparisons against its parent at priority (10).",
    )


class RegisteredModelSerializer(TandemModelSerializer):
    inputs = serializers.PrimaryKeyRelatedField(many=True, read_only=True)

    class Meta:
        model = RegisteredModel
        fields = [
            "id",
            "name",
            "kind",
            "path",
            "run",
            "snapshot",
            "snapshot_hash",
            "base_policy",
            "base_model",
            "inputs",
            "metrics",
            "created_at",
        ]
        read_only_fields = fields


class EvaluationSerializer(TandemModelSerializer):
    policy_version = ProjectRelatedField(model=PolicyVersion, required=False, allow_null=True)
    run = ProjectRelatedField(model=TrainingRun, required=False, allow_null=True)

    class Meta:
        model = Evaluation
        fields = ["id", "policy_version", "run", "name", "decoding", "value", "stderr", "n", "details", "created_at"]
        read_only_fields = ["created_at"]

    def validate(self, attrs: dict) -> dict:
        if attrs.get("policy_version") is None and attrs.get("run") is None:
            raise serializers.ValidationError({"policy_version": "Give the policy version or the run it measures."})
        return attrs


# --- Labels -------------------------------------------------------------------------------------------------------

LABEL_FIELDS = [
    "id",
    "annotator",
    "annotator_username",
    "revision",
    "supersedes",
    "is_current",
    "client_token",
    "seconds_spent",
    "query_strategy",
    "assignment",
    "created_at",
]
LABEL_READ_ONLY = ["revision", "supersedes", "is_current", "query_strategy", "created_at"]


class LabelSerializer(TandemModelSerializer):
    """Fields every label kind shares. The annotator is always the caller; `client_token` (a UUID the client makes
    per submit) turns a retried POST into a 200 with the stored row instead of a second label."""

    annotator = serializers.PrimaryKeyRelatedField(read_only=True)
    annotator_username = serializers.CharField(source="annotator.username", read_only=True)
    client_token = serializers.UUIDField(
        required=False, allow_null=True, help_text="Make one per submit; a retry with the same token is stored once."
    )
    seconds_spent = serializers.FloatField(required=False, allow_null=True, min_value=0)
    assignment = ProjectRelatedField(
        model=Assignment,
        project_path="item__project",
        required=False,
        allow_null=True,
        help_text="Your assignment this label answers; it is marked done in the same transaction (a step_label "
        "item, whose critiques, ratings and interventions may answer it too, is handed in with "
        "assignments/<id>/finish/).",
    )

    def validate_assignment(self, assignment: Assignment | None) -> Assignment | None:
        request = self.context.get("request")
        if assignment is not None and request is not None and assignment.annotator_id != request.user.pk:
            raise serializers.ValidationError("This assignment is not yours.")
        return assignment


class LabelRevisionMixin:
    """For PUT and PATCH: what the label is about is fixed, only its judgement changes (as a new revision)."""

    fixed_fields: tuple[str, ...] = ("assignment",)

    def get_fields(self) -> dict:
        fields = super().get_fields()
        for name in (*self.Meta.model.item_fields, *self.fixed_fields):
            fields[name].read_only = True
            fields[name].required = False
        return fields


class ComparisonSerializer(LabelSerializer):
    trajectory_a = ProjectRelatedField(model=Trajectory)
    trajectory_b = ProjectRelatedField(model=Trajectory)

    class Meta:
        model = Comparison
        fields = [*LABEL_FIELDS, "trajectory_a", "trajectory_b", "choice", "strength", "rationale", "displayed_order"]
        read_only_fields = LABEL_READ_ONLY
        extra_kwargs = {
            "choice": {"help_text": "a, b, tie or both_bad, relative to trajectory_a and trajectory_b as sent."},
            "displayed_order": {"help_text": "ab if trajectory_a was shown on the left, ba otherwise."},
        }


class StepLabelSerializer(LabelSerializer):
    step = ProjectRelatedField(model=Step, project_path="trajectory__project")
    trajectory = serializers.IntegerField(source="step.trajectory_id", read_only=True)

    class Meta:
        model = StepLabel
        fields = [*LABEL_FIELDS, "step", "trajectory", "value"]
        read_only_fields = LABEL_READ_ONLY


class CritiqueSerializer(LabelSerializer):
    trajectory = ProjectRelatedField(model=Trajectory)
    step = ProjectRelatedField(model=Step, project_path="trajectory__project", required=False, allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, default=list)

    class Meta:
        model = Critique
        fields = [*LABEL_FIELDS, "trajectory", "step", "span_field", "span_start", "span_end", "text", "tags"]
        read_only_fields = LABEL_READ_ONLY


class RatingSerializer(LabelSerializer):
    trajectory = ProjectRelatedField(model=Trajectory)

    class Meta:
        model = Rating
        fields = [*LABEL_FIELDS, "trajectory", "score", "thumb_up", "comment"]
        read_only_fields = LABEL_READ_ONLY
        extra_kwargs = {"score": {"min_value": 1, "max_value": 5}}

    def validate(self, attrs: dict) -> dict:
        score = attrs.get("score", getattr(self.instance, "score", None))
        thumb = attrs.get("thumb_up", getattr(self.instance, "thumb_up", None))
        if score is None and thumb is None:
            raise serializers.ValidationError({"score": "Give a score (1–5), a thumb, or both."})
        return attrs


class InterventionSerializer(LabelSerializer):
    trajectory = ProjectRelatedField(model=Trajectory)
    step = ProjectRelatedField(model=Step, project_path="trajectory__project")
    corrected_action = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="An action from the environment's legal ones (the gridworld's moves); or give corrected_message.",
    )
    corrected_message = CheckedJSONField(
        required=False,
        help_text="The corrected turn as an assistant message: tool_calls (OpenAI's shape, arguments checked against "
        "the task's tool schemas) and/or content. Use it for open actions; corrected_action for picked ones.",
    )
    takeover_actions = CheckedJSONField(
        required=False, default=list, help_text="Turns played by hand after it: actions, or assistant messages."
    )

    class Meta:
        model = Intervention
        fields = [
            *LABEL_FIELDS,
            "trajectory",
            "step",
            "original_message",
            "original_action",
            "original_reasoning",
            "corrected_message",
            "corrected_action",
            "corrected_reasoning",
            "takeover_actions",
            "reason",
            "child_trajectory",
            "status",
            "error",
        ]
        read_only_fields = [
            *LABEL_READ_ONLY,
            "original_message",
            "original_action",
            "original_reasoning",
            "child_trajectory",
            "status",
            "error",
        ]

    def validate_corrected_message(self, value):
        if not isinstance(value, dict) or value.get("role", "assistant") != "assistant":
            raise serializers.ValidationError(
                "Must be an assistant message: an object with content and/or tool_calls."
            )
        return {"role": "assistant", **value}

    def validate_takeover_actions(self, value):
        if not isinstance(value, list) or not all(isinstance(turn, str | dict) for turn in value):
            raise serializers.ValidationError("Must be a list of actions or assistant messages.")
        return value

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        if self.instance is None and not attrs.get("corrected_message") and not attrs.get("corrected_action"):
            raise serializers.ValidationError({"corrected_action": "Give corrected_action or corrected_message."})
        return attrs


class ComparisonRevisionSerializer(LabelRevisionMixin, ComparisonSerializer):
    pass


class StepLabelRevisionSerializer(LabelRevisionMixin, StepLabelSerializer):
    pass


class CritiqueRevisionSerializer(LabelRevisionMixin, CritiqueSerializer):
    pass


class RatingRevisionSerializer(LabelRevisionMixin, RatingSerializer):
    pass


class InterventionRevisionSerializer(LabelRevisionMixin, InterventionSerializer):
    # A different action is a different branch of the rollout (checked against the environment and continued by
    # the policy): only the explanation of a correction is revised.
    fixed_fields = ("assignment", "corrected_action", "corrected_message", "takeover_actions")
