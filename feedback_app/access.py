"""Who may see what. Every view fetches its objects through these helpers, so an outsider gets 404, never a hint
that a project exists."""

from __future__ import annotations

from django.http import Http404, HttpRequest

from feedback_app.models import Membership, Project, Role, Trajectory


def get_membership(request: HttpRequest, project_pk: int) -> Membership:
    membership = (
        Membership.objects.select_related("project", "project__environment")
        .filter(project_id=project_pk, user=request.user)
        .first()
    )
    if membership is None:
        raise Http404("No such project.")
    return membership


def get_project_for_member(request: HttpRequest, project_pk: int) -> tuple[Project, Membership]:
    membership = get_membership(request, project_pk)
    return membership.project, membership


def get_trajectory_for_member(
    request: HttpRequest, project_pk: int, trajectory_pk: int
) -> tuple[Trajectory, Membership]:
    membership = get_membership(request, project_pk)
    trajectory = (
        Trajectory.objects.select_related("task", "policy_version", "parent")
        .filter(project_id=project_pk, pk=trajectory_pk)
        .first()
    )
    if trajectory is None:
        raise Http404("No such trajectory.")
    return trajectory, membership


def sees_outcomes(membership: Membership) -> bool:
    """Outcomes (success, return, oracle facts) and policy names in blind projects are for researchers only."""
    return membership.role in (Role.RESEARCHER, Role.ADMIN)
