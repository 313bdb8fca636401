"""Trajectories with their steps. Annotators read them without outcomes (and without policy names in blind
projects); researchers and admins add them one at a time here or in bulk through the import endpoints."""

from __future__ import annotations

from django.db import transaction
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from feedback_app.api.base import ProjectScopedMixin
from feedback_app.api.filtering import TandemFilterSet
from feedback_app.api.serializers.trajectories import TrajectoryDetailSerializer, TrajectorySerializer
from feedback_app.imports.results import ImportResult
from feedback_app.imports.trajectories import TrajectoryRows
from feedback_app.models import Trajectory
from feedback_app.models.trajectories import TrajectorySource
from feedback_app.trajectory_schema import TrajectoryImportSerializer

# Filters that would let an annotator sort trajectories by outcome, or by policy in a blind project.
OUTCOME_FILTERS = ("success",)
POLICY_FILTERS = ("policy_version", "rollout_run")


class TrajectoryFilter(TandemFilterSet):
    source = filters.ChoiceFilter(choices=TrajectorySource.choices)
    created_after = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    success = filters.BooleanFilter(help_text="Researchers and admins only.")
    policy_version = filters.NumberFilter(help_text="In a blind project, researchers and admins only.")
    rollout_run = filters.NumberFilter(help_text="In a blind project, researchers and admins only.")

    class Meta:
        model = Trajectory
        fields = ["task", "parent", "external_id", "source", "policy_version", "rollout_run", "success"]


@extend_schema_view(
    list=extend_schema(summary="A project's trajectories, newest first (without steps)"),
    retrieve=extend_schema(summary="One trajectory with its steps"),
    create=extend_schema(
        summary="Add one trajectory (researchers and admins)",
        description="The body is one row of the import schema (see the import endpoint). An `external_id` that is "
        "already stored returns that trajectory with 200 instead of storing it twice.",
        request=TrajectoryImportSerializer,
        responses={201: TrajectoryDetailSerializer, 200: TrajectoryDetailSerializer},
    ),
)
class TrajectoryViewSet(
    ProjectScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    filterset_class = TrajectoryFilter

    def get_serializer_class(self):
        return TrajectorySerializer if self.action == "list" else TrajectoryDetailSerializer

    def get_queryset(self):
        if self.is_schema_view:
            return Trajectory.objects.none()
        trajectories = Trajectory.objects.filter(project=self.project).select_related("policy_version")
        if self.action != "list":
            trajectories = trajectories.prefetch_related("steps")
        return trajectories

    def filter_queryset(self, queryset):
        hidden = () if self.sees_outcomes else OUTCOME_FILTERS + (POLICY_FILTERS if self.project.blind else ())
        refused = [name for name in hidden if name in self.request.query_params]
        if refused:
            raise ValidationError({name: ["Only researchers and admins may filter by this."] for name in refused})
        return super().filter_queryset(queryset)

    def create(self, request, *args, **kwargs) -> Response:
        row = TrajectoryImportSerializer(data=request.data)
        row.is_valid(raise_exception=True)
        result = ImportResult()
        with transaction.atomic():
            TrajectoryRows(self.project).store([row.validated_data], result)
        trajectory = self.get_queryset().get(external_id=row.validated_data["external_id"])
        return Response(
            TrajectoryDetailSerializer(trajectory, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )
