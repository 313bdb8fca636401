"""Trajectories with their steps, and the queue: items, assignments, leasing the next one, skipping."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from feedback_app.api.base import HiddenFieldsMixin
from feedback_app.api.fields import (
    RESEARCHERS_ONLY,
    TandemModelSerializer,
)
from feedback_app.labelling import displayed_order
from feedback_app.models import (
    Assignment,
    Comparison,
    LabelKind,
    QueueItem,
    Step,
    Trajectory,
)


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
