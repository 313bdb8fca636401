"""Training runs: reading them, launching each kind, and the models and evaluations they register."""

from __future__ import annotations

from rest_framework import serializers

from feedback_app.api.fields import (
    ProjectRelatedField,
    TandemModelSerializer,
)
from feedback_app.models import (
    DatasetSnapshot,
    Evaluation,
    PolicyVersion,
    RegisteredModel,
    TrainingRun,
)
from feedback_app.models.trajectories import PolicyKind
from training import launch


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


def judges_field(help_text: str) -> serializers.DictField:
    """The registered judge models a launch names, by the setting each fills."""
    return serializers.DictField(
        child=ProjectRelatedField(model=RegisteredModel), required=False, default=dict, help_text=help_text
    )


def settings_field(help_text: str) -> serializers.DictField:
    """An optional object of settings, checked by the run kind's own config when the launch is."""
    return serializers.DictField(required=False, default=dict, help_text=help_text)


class RolloutLaunchSerializer(serializers.Serializer):
    """Launch a rollout run: the policy version plays tasks and the trajectories come back for review."""

    kind = serializers.ChoiceField(choices=["rollout"], default="rollout", help_text="Only rollout runs for now.")
    policy_version = ProjectRelatedField(model=PolicyVersion)
    config = settings_field(
        "Rollout settings: task_ids, split, num_tasks, samples_per_task, greedy, temperature, seed, max_turns, "
        "compare_with_parent, review_priority, queue_comparisons (pairs to queue by the project's query strategy), "
        "queue_step_labels (training.rollouts.RolloutConfig)."
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
    judges = judges_field("Registered judge models a run uses, by setting: value_critic takes reward_model and prm.")
    config = settings_field(
        "Pipeline settings (see `python -m reward_models.<pipeline> --help`), e.g. learning_rate, num_epochs, "
        "batch_size, ensemble_size; `name` names the registered model."
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
    judges = judges_field(
        "Registered judge models by setting: ppo takes reward_model_path, prm_path, value_critic_path; nash_md and "
        "spo take preference_model_path (a preference model or a reward model); grpo takes reward_model_path."
    )
    config = settings_field(
        "Trainer settings (see `python -m reward_models.finetune.<trainer> --help`), e.g. learning_rate, max_steps, "
        "beta; `name` names the new policy version."
    )
    review = settings_field(
        "What happens on success: enabled (default true) rolls the new version out on num_tasks review tasks (16) × "
        "samples_per_task (1) and queues blind comparisons against its parent at priority (10)."
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
