"""Projects, their tasks and their policy versions."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import ProtectedError
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.response import Response

from feedback_app.access import MANAGER_ROLES, get_membership, get_project_for_role
from feedback_app.api.base import Conflict, ProjectScopedMixin, ThrottleAfterAccessMixin
from feedback_app.api.filtering import TandemFilterSet
from feedback_app.api.schema import ErrorSerializer
from feedback_app.api.serializers.projects import PolicyVersionSerializer, ProjectSerializer, TaskSerializer
from feedback_app.models import Membership, PolicyVersion, Project, Role, Task
from feedback_app.win_rates import human_win_rates

# Settings researchers may change through PATCH; every other project setting is for admins.
RESEARCHER_SETTINGS = {"query_strategy"}

IN_USE = OpenApiResponse(ErrorSerializer, description="Still used by other rows (e.g. trajectories); not deleted.")


def destroy_unless_used(instance, what: str) -> Response:
    try:
        instance.delete()
    except ProtectedError as exc:
        raise Conflict(f"This {what} is still used by {len(exc.protected_objects)} other row(s).") from None
    return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(summary="The projects I belong to, with my role in each"),
    create=extend_schema(summary="Create a project; the creator becomes its admin"),
    retrieve=extend_schema(summary="One project"),
    update=extend_schema(summary="Change a project's settings (admins)"),
    partial_update=extend_schema(
        summary="Change some of a project's settings (admins; researchers may change query_strategy)"
    ),
    destroy=extend_schema(
        summary="Delete a project that holds no trajectories (admins)",
        description="Trajectories (and so labels) protect their project: delete is refused with 409 while any "
        "remain. Tasks and policy versions go with the project.",
        responses={204: None, 409: IN_USE},
    ),
)
class ProjectViewSet(ThrottleAfterAccessMixin, viewsets.ModelViewSet):
    serializer_class = ProjectSerializer
    lookup_url_kwarg = "project_pk"
    lookup_value_converter = "int"
    filterset_fields = ["blind"]

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if "project_pk" not in kwargs:  # the list and create: nothing of another's to hide
            self.access_checked(request)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Project.objects.none()
        return Project.objects.filter(memberships__user=self.request.user).select_related("environment")

    def get_serializer_context(self) -> dict:
        context = super().get_serializer_context()
        if not getattr(self, "swagger_fake_view", False):
            context["roles"] = dict(
                Membership.objects.filter(user=self.request.user).values_list("project_id", "role")
            )
        return context

    def get_object(self) -> Project:
        pk = self.kwargs["project_pk"]
        data = self.request.data
        if self.request.method == "PATCH" and isinstance(data, dict) and set(data) <= RESEARCHER_SETTINGS:
            project, _ = get_project_for_role(self.request, pk, *MANAGER_ROLES)
        elif self.request.method in ("PUT", "PATCH", "DELETE"):
            project, _ = get_project_for_role(self.request, pk, Role.ADMIN)
        else:
            project = get_membership(self.request, pk).project
        self.access_checked(self.request)
        return project

    def perform_create(self, serializer) -> None:
        # People who run a project (researchers and admins somewhere, or staff) may start one; annotators may not.
        user = self.request.user
        if not (user.is_staff or Membership.objects.filter(user=user, role__in=MANAGER_ROLES).exists()):
            raise PermissionDenied("Only staff, researchers and admins may create projects.")
        with transaction.atomic():
            project = serializer.save()
            Membership.objects.create(user=user, project=project, role=Role.ADMIN)

    def perform_destroy(self, instance: Project) -> None:
        destroy_unless_used(instance, "project")


class TaskFilter(TandemFilterSet):
    class Meta:
        model = Task
        fields = ["split", "seed", "external_id"]


@extend_schema_view(
    list=extend_schema(summary="A project's tasks"),
    create=extend_schema(summary="Add a task (researchers and admins)"),
    retrieve=extend_schema(summary="One task"),
    update=extend_schema(summary="Change a task (researchers and admins)"),
    partial_update=extend_schema(summary="Change some of a task (researchers and admins)"),
    destroy=extend_schema(summary="Delete a task with no trajectories", responses={204: None, 409: IN_USE}),
)
class TaskViewSet(ProjectScopedMixin, viewsets.ModelViewSet):
    serializer_class = TaskSerializer
    filterset_class = TaskFilter

    def get_queryset(self):
        if self.is_schema_view:
            return Task.objects.none()
        return Task.objects.filter(project=self.project)

    def perform_create(self, serializer) -> None:
        serializer.save(project=self.project)

    def destroy(self, request, *args, **kwargs) -> Response:
        return destroy_unless_used(self.get_object(), "task")


@extend_schema_view(
    list=extend_schema(summary="A project's policy versions (researchers, or every member if not blind)"),
    create=extend_schema(summary="Register a policy version (researchers and admins)"),
    retrieve=extend_schema(summary="One policy version"),
    update=extend_schema(summary="Change a policy version (researchers and admins)"),
    partial_update=extend_schema(summary="Change some of a policy version (researchers and admins)"),
    destroy=extend_schema(summary="Delete a policy version nothing refers to", responses={204: None, 409: IN_USE}),
)
class PolicyVersionViewSet(ProjectScopedMixin, viewsets.ModelViewSet):
    serializer_class = PolicyVersionSerializer
    filterset_fields = ["kind", "parent"]

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if self.project.blind and not self.sees_outcomes:
            raise PermissionDenied("The project is blind: its policy versions are for researchers and admins.")

    def get_queryset(self):
        if self.is_schema_view:
            return PolicyVersion.objects.none()
        return PolicyVersion.objects.filter(project=self.project)

    def get_serializer(self, *args, **kwargs):
        if kwargs.get("many") and args:
            # A page of versions gets every win rate from one query rather than one query per version.
            versions = list(args[0])
            kwargs.setdefault("context", self.get_serializer_context())["win_rates"] = human_win_rates(versions)
            args = (versions, *args[1:])
        return super().get_serializer(*args, **kwargs)

    def perform_create(self, serializer) -> None:
        serializer.save(project=self.project)

    def destroy(self, request, *args, **kwargs) -> Response:
        return destroy_unless_used(self.get_object(), "policy version")
