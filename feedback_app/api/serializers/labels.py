"""Labels of every kind, and their revisions: what is fixed once a label is stored and what a revision may change."""

from __future__ import annotations

from rest_framework import serializers

from feedback_app.api.fields import (
    CheckedJSONField,
    ProjectRelatedField,
    TandemModelSerializer,
)
from feedback_app.models import (
    Assignment,
    Comparison,
    Critique,
    Intervention,
    Rating,
    Step,
    StepLabel,
    Trajectory,
)

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
