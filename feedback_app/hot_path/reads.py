"""The reads of the annotators' busiest request (see `feedback_app.hot_path`): the user's membership of a project
(with the project and its environment; every page of a project starts with it), the membership together with one of
the user's assignments, the pair of trajectories a comparison shows, and their steps, whose renderings are kept per
process."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from django.db import connection
from django.utils.safestring import SafeString

from feedback_app.hot_path.queue_sql import ASSIGNMENT_COLUMNS, ASSIGNMENT_TABLE, ITEM_TABLE, assignment_from_row
from feedback_app.hot_path.rows import MAX_ID, Rows, fetch_all, fetch_one
from feedback_app.models import (
    Assignment,
    EnvironmentSpec,
    Membership,
    PolicyVersion,
    Project,
    Step,
    Task,
    Trajectory,
)

_MEMBERSHIPS, _PROJECTS, _ENVIRONMENTS = Rows(Membership, "m"), Rows(Project, "p"), Rows(EnvironmentSpec, "e")
# The membership's columns (with its project and environment) and the tables they come from: `_membership_from_row`
# reads the first _MEMBERSHIP_WIDTH values of a row.
_MEMBERSHIP_COLUMNS = f"{_MEMBERSHIPS.columns}, {_PROJECTS.columns}, {_ENVIRONMENTS.columns}"
_MEMBERSHIP_TABLES = f"""{_MEMBERSHIPS.table}
    JOIN {_PROJECTS.table} ON p.id = m.project_id
    JOIN {_ENVIRONMENTS.table} ON e.id = p.environment_id"""
_MEMBERSHIP_WIDTH = _MEMBERSHIPS.width + _PROJECTS.width + _ENVIRONMENTS.width
_MEMBERSHIP_SQL = f"SELECT {_MEMBERSHIP_COLUMNS} FROM {_MEMBERSHIP_TABLES} WHERE m.project_id = %s AND m.user_id = %s"


def membership(project_pk: int, user) -> Membership | None:
    """`user`'s membership of the project, with the project and its environment; None for outsiders."""
    row = fetch_one(_MEMBERSHIP_SQL, [project_pk, user.pk]) if project_pk <= MAX_ID else None
    return None if row is None else _membership_from_row(row, user)


def _membership_from_row(row, user) -> Membership:
    """The membership of `user`, with its project and environment, from a row that starts with _MEMBERSHIP_COLUMNS."""
    found = _MEMBERSHIPS.read(row)
    found.project = _PROJECTS.read(row[_MEMBERSHIPS.width :])
    found.project.environment = _ENVIRONMENTS.read(row[_MEMBERSHIPS.width + _PROJECTS.width :])
    found.user = user
    return found


_MEMBER_ASSIGNMENT_SQL = f"""
    SELECT {_MEMBERSHIP_COLUMNS}, {ASSIGNMENT_COLUMNS}
    FROM {_MEMBERSHIP_TABLES}
    LEFT JOIN ({ASSIGNMENT_TABLE} JOIN {ITEM_TABLE} ON qi.id = a.item_id)
        ON a.id = %s AND a.annotator_id = m.user_id AND qi.project_id = m.project_id AND qi.kind = %s
    WHERE m.project_id = %s AND m.user_id = %s
"""


def membership_and_assignment(
    project_pk: int, user, assignment_pk: int, kind: str
) -> tuple[Membership | None, Assignment | None]:
    """In one statement: `user`'s membership of the project (as `membership` gives it; None for outsiders) and
    the user's own assignment `assignment_pk` of `kind` in it, with its item (None if there is no such assignment)."""
    row = None
    if project_pk <= MAX_ID and assignment_pk <= MAX_ID:
        row = fetch_one(_MEMBER_ASSIGNMENT_SQL, [assignment_pk, kind, project_pk, user.pk])
    if row is None:
        return None, None
    found = _membership_from_row(row, user)
    if row[_MEMBERSHIP_WIDTH] is None:
        return found, None
    return found, assignment_from_row(row[_MEMBERSHIP_WIDTH:], found.project)


# Only what the compare page shows (the oracle and metadata can be large, and annotators never see them).
_TRAJECTORIES = Rows(Trajectory, "t", ["task", "policy_version", "success", "created_at"])
_TASKS, _POLICIES = Rows(Task, "k", ["instruction"]), Rows(PolicyVersion, "v", ["name"])
_PAIR_SQL = f"""
    SELECT {_TRAJECTORIES.columns}, {_TASKS.columns}, {_POLICIES.columns}
    FROM {_TRAJECTORIES.table}
    JOIN {_TASKS.table} ON k.id = t.task_id
    LEFT JOIN {_POLICIES.table} ON v.id = t.policy_version_id
    WHERE t.id IN (%s, %s)
"""


def pair_trajectories(*pks: int) -> dict[int, Trajectory]:
    """Two trajectories by id, with their task and policy version: only the fields the compare page shows are
    loaded, the others are deferred."""
    trajectories = {}
    for row in fetch_all(_PAIR_SQL, list(pks)):
        trajectory = _TRAJECTORIES.read(row)
        trajectory.task = _TASKS.read(row[_TRAJECTORIES.width :])
        has_policy = trajectory.policy_version_id is not None
        trajectory.policy_version = _POLICIES.read(row[_TRAJECTORIES.width + _TASKS.width :]) if has_policy else None
        trajectories[trajectory.pk] = trajectory
    return trajectories


# Rendered steps of the trajectories shown lately, per process, the least recently shown dropped first beyond
# STEP_CACHE_CHARACTERS (a gridworld trajectory renders to some 25,000). Steps never change once stored, and a
# trajectory is shown in many comparisons (every pair it belongs to, times the overlap). The key holds the creation
# time as well as the id, so a reused id (SQLite reuses them after a rollback) never finds another trajectory's steps.
# A plain dictionary, not Django's local-memory cache, which would pickle and unpickle them on every request.
_STEP_CACHE: OrderedDict[tuple, tuple[dict[int, SafeString], int]] = OrderedDict()
_STEP_CACHE_LOCK = threading.Lock()
_step_cache_characters = 0
STEP_CACHE_CHARACTERS = 20_000_000
_STEPS = Rows(Step, "s")
_STEPS_SQL = "SELECT {} FROM {} WHERE s.trajectory_id = %s ORDER BY s.{}".format(
    _STEPS.columns, _STEPS.table, connection.ops.quote_name("index")
)


def rendered_steps(
    trajectory: Trajectory, variant: bool, render: Callable[[list[Step]], dict[int, SafeString]]
) -> dict[int, SafeString]:
    """The trajectory's steps (in order) as `render` renders them, by index, kept per process; `variant` tells
    renderings of the same steps apart (a page that shows outcomes renders them otherwise)."""
    global _step_cache_characters
    key = (trajectory.pk, trajectory.created_at, variant)
    with _STEP_CACHE_LOCK:
        if (cached := _STEP_CACHE.get(key)) is not None:
            _STEP_CACHE.move_to_end(key)
            return cached[0]
    rendered = render([_STEPS.read(row) for row in fetch_all(_STEPS_SQL, [trajectory.pk])])
    size = sum(map(len, rendered.values()))
    with _STEP_CACHE_LOCK:
        if key not in _STEP_CACHE:  # another thread may have rendered it meanwhile
            _STEP_CACHE[key] = (rendered, size)
            _step_cache_characters += size
        while _step_cache_characters > STEP_CACHE_CHARACTERS and _STEP_CACHE:
            _step_cache_characters -= _STEP_CACHE.popitem(last=False)[1][1]
    return rendered
