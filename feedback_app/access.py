"""Who may see what. Every view fetches its objects through these helpers, so an outsider gets 404, never a hint
that a project exists."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from feedback_app.hot_path import reads
from feedback_app.models import Membership, Project, Role, Trajectory


def get_membership(request: HttpRequest, project_pk: int) -> Membership:
    """The user's membership of the project, with the project and its environment; 404 for outsiders."""
    membership = reads.membership(project_pk, request.user)
    if membership is None:
        raise Http404("No such project.")
    return membership


def get_project_for_member(request: HttpRequest, project_pk: int) -> tuple[Project, Membership]:
    membership = get_membership(request, project_pk)
    return membership.project, membership


def get_project_for_role(request: HttpRequest, project_pk: int, *roles: str) -> tuple[Project, Membership]:
    """The project, if the user holds one of `roles` in it. Outsiders get 404; members without the role get 403."""
    membership = get_membership(request, project_pk)
    if membership.role not in roles:
        raise PermissionDenied(f"This needs the {' or '.join(roles)} role in the project.")
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


MANAGER_ROLES = (Role.RESEARCHER, Role.ADMIN)
