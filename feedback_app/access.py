"""Who may see what. Every view fetches its objects through these helpers, so an outsider gets 404, never a hint
that a project exists."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from feedback_app.models import EnvironmentSpec, Membership, Project, Role, Trajectory
from feedback_app.rows import MAX_ID, Rows, fetch_one

# Every page of a project starts with this query, the annotators' busiest request too (see feedback_app/rows.py).
_MEMBERSHIPS, _PROJECTS, _ENVIRONMENTS = Rows(Membership, "m"), Rows(Project, "p"), Rows(EnvironmentSpec, "e")
# The membership's columns (with its project and environment) and the tables they come from: `membership_from_row`
# reads the first MEMBERSHIP_WIDTH values of a row. Other statements of busy requests join more onto these.
MEMBERSHIP_COLUMNS = f"{_MEMBERSHIPS.columns}, {_PROJECTS.columns}, {_ENVIRONMENTS.columns}"
MEMBERSHIP_TABLES = f"""{_MEMBERSHIPS.table}
    JOIN {_PROJECTS.table} ON p.id = m.project_id
    JOIN {_ENVIRONMENTS.table} ON e.id = p.environment_id"""
MEMBERSHIP_WIDTH = _MEMBERSHIPS.width + _PROJECTS.width + _ENVIRONMENTS.width
_MEMBERSHIP_SQL = f"SELECT {MEMBERSHIP_COLUMNS} FROM {MEMBERSHIP_TABLES} WHERE m.project_id = %s AND m.user_id = %s"


def get_membership(request: HttpRequest, project_pk: int) -> Membership:
    """The user's membership of the project, with the project and its environment; 404 for outsiders."""
    row = fetch_one(_MEMBERSHIP_SQL, [project_pk, request.user.pk]) if project_pk <= MAX_ID else None
    if row is None:
        raise Http404("No such project.")
    return membership_from_row(row, request.user)


def membership_from_row(row, user) -> Membership:
    """The membership of `user`, with its project and environment, from a row that starts with MEMBERSHIP_COLUMNS."""
    membership = _MEMBERSHIPS.read(row)
    membership.project = _PROJECTS.read(row[_MEMBERSHIPS.width :])
    membership.project.environment = _ENVIRONMENTS.read(row[_MEMBERSHIPS.width + _PROJECTS.width :])
    membership.user = user
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
