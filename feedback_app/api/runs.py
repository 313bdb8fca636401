"""Assignments (read), training runs (read; launch a rollout; cancel) and evaluations."""

from __future__ import annotations

from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from feedback_app.access import MANAGER_ROLES
from feedback_app.api.base import Conflict, ProjectListCreateViewSet, ProjectScopedMixin
from feedback_app.api.filtering import TandemFilterSet
from feedback_app.api.schema import ErrorSerializer, ValidationErrorSerializer
from feedback_app.api.serializers.runs import (
    EvaluationSerializer,
    JudgeLaunchSerializer,
    PolicyLaunchSerializer,
    RegisteredModelSerializer,
    RolloutLaunchSerializer,
    TrainingRunSerializer,
)
from feedback_app.api.serializers.trajectories import AssignmentSerializer
from feedback_app.models import Assignment, Evaluation, RegisteredModel, TrainingRun
from training import launch

RUN_LAUNCH = PolymorphicProxySerializer(
    component_name="RunLaunch",
    serializers={
        "rollout": RolloutLaunchSerializer,
        "reward_model": JudgeLaunchSerializer,
        "prm": JudgeLaunchSerializer,
        "value_critic": JudgeLaunchSerializer,
        "generative_critic": JudgeLaunchSerializer,
        "preference_model": JudgeLaunchSerializer,
        **dict.fromkeys(["dpo", "kto", "sft", "ppo", "nash_md", "spo", "grpo"], PolicyLaunchSerializer),
    },
    resource_type_field_name="kind",
)


class AssignmentFilter(TandemFilterSet):
    kind = filters.CharFilter(field_name="item__kind")

    class Meta:
        model = Assignment
        fields = ["status", "annotator", "kind"]


@extend_schema_view(
    list=extend_schema(summary="Assignments, newest first (annotators: only their own)"),
    retrieve=extend_schema(summary="One assignment"),
)
class AssignmentViewSet(ProjectScopedMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = AssignmentSerializer
    filterset_class = AssignmentFilter

    def get_queryset(self):
        if self.is_schema_view:
            return Assignment.objects.none()
        assignments = Assignment.objects.filter(item__project=self.project).select_related("item", "annotator")
        if not self.membership.can_manage:
            assignments = assignments.filter(annotator=self.request.user)
        return assignments


class TrainingRunFilter(TandemFilterSet):
    class Meta:
        model = TrainingRun
        fields = ["kind", "status", "base_policy"]


@extend_schema_view(
    list=extend_schema(summary="Training, rollout and evaluation runs, newest first (researchers and admins)"),
    retrieve=extend_schema(summary="One run with its progress, metrics, log and outcome"),
    create=extend_schema(
        summary="Launch a rollout, a judge-model run or a policy fine-tuning run (researchers and admins)",
        description=(
            "`kind` picks the run. `rollout` (the default) plays a policy version on tasks, on the rollouts queue. "
            "`reward_model`, `prm`, `value_critic`, `generative_critic` and `preference_model` train a judge model "
            "from a dataset snapshot on the training queue, and register it under `models/` when it succeeds. "
            "`dpo`, `kto`, `sft`, `ppo`, `nash_md`, `spo` and `grpo` fine-tune a policy version (from a snapshot "
            "or registered judge models) into a new version whose parent it is, then roll it out on review tasks "
            "and queue blind comparisons against the parent (unless `review.enabled` is false). The run is recorded "
            "and enqueued once the transaction commits; a bad field or setting (`config.<name>`) is a 400 naming it."
        ),
        request=RUN_LAUNCH,
        responses={
            201: TrainingRunSerializer,
            400: OpenApiResponse(ValidationErrorSerializer, description="A bad field or pipeline setting, named."),
        },
    ),
)
class TrainingRunViewSet(ProjectListCreateViewSet):
    read_roles = MANAGER_ROLES
    serializer_class = TrainingRunSerializer
    filterset_class = TrainingRunFilter

    def get_queryset(self):
        return self.project_rows(TrainingRun).select_related("created_by")

    def create(self, request, *args, **kwargs) -> Response:
        kind = request.data.get("kind", "rollout")
        if kind in launch.POLICY_RUN_KINDS:
            data = self._validated(PolicyLaunchSerializer, request)
            return self._launched(request, launch.create_policy_run, data, ("base_policy", "snapshot"))
        if kind != "rollout":
            data = self._validated(JudgeLaunchSerializer, request)
            return self._launched(request, launch.create_judge_run, data, ("base_policy",))
        data = self._validated(RolloutLaunchSerializer, request)
        run = launch.create_rollout_run(
            self.project, data["policy_version"], data["rollout_config"], created_by=request.user
        )
        launch.send(run)
        return Response(self.get_serializer(run).data, status=status.HTTP_201_CREATED)

    def _validated(self, serializer_class, request) -> dict:
        serializer = serializer_class(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def _launched(self, request, create, data: dict, optional: tuple[str, ...]) -> Response:
        """Store a judge or policy run through `create` (its `LaunchError` becomes a 400 naming each field) and
        send it to its worker once the transaction commits."""
        kind = data.pop("kind")
        for name in optional:
            data.setdefault(name, None)
        try:
            run = create(self.project, kind, **data, created_by=request.user)
        except launch.LaunchError as exc:
            raise serializers.ValidationError({name: [reason] for name, reason in exc.errors.items()}) from None
        launch.send(run)
        return Response(self.get_serializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Cancel a run (researchers and admins)",
        description="A queued run is cancelled at once; a running one stops at its next progress report.",
        request=None,
        responses={
            200: TrainingRunSerializer,
            409: OpenApiResponse(ErrorSerializer, description="The run has already finished."),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, *args, **kwargs) -> Response:
        run = self.get_object()
        if not launch.request_cancel(run):
            raise Conflict(f"Run {run.pk} has already finished ({run.status}).")
        run.refresh_from_db()
        return Response(self.get_serializer(run).data)


class EvaluationFilter(TandemFilterSet):
    class Meta:
        model = Evaluation
        fields = ["policy_version", "run", "name", "decoding"]


@extend_schema_view(
    list=extend_schema(summary="Evaluation figures, newest first (researchers and admins)"),
    retrieve=extend_schema(summary="One evaluation figure"),
    create=extend_schema(summary="Record an evaluation figure, e.g. from your own harness (researchers and admins)"),
)
class EvaluationViewSet(ProjectListCreateViewSet):
    read_roles = MANAGER_ROLES
    serializer_class = EvaluationSerializer
    filterset_class = EvaluationFilter

    def get_queryset(self):
        return self.project_rows(Evaluation)

    def perform_create(self, serializer) -> None:
        serializer.save(project=self.project)


class RegisteredModelFilter(TandemFilterSet):
    class Meta:
        model = RegisteredModel
        fields = ["kind", "snapshot", "base_policy"]


@extend_schema_view(
    list=extend_schema(summary="The model registry: judge models with their lineage, newest first"),
    retrieve=extend_schema(summary="One registered model: its directory, run, snapshot, base and metrics"),
)
class RegisteredModelViewSet(ProjectScopedMixin, viewsets.ReadOnlyModelViewSet):
    read_roles = MANAGER_ROLES
    serializer_class = RegisteredModelSerializer
    filterset_class = RegisteredModelFilter

    def get_queryset(self):
        return self.project_rows(RegisteredModel).prefetch_related("inputs")
