"""Shared fixtures. The users' names say on which side of the permission boundary they stand."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def pytest_configure(config) -> None:
    from django.conf import settings

    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)


@pytest.fixture
def gridworld_spec(db):
    from feedback_app.models import EnvironmentSpec

    return EnvironmentSpec.objects.create(
        name="gridworld-test",
        dotted_path="reward_models.envs.gridworld.GridWorld",
        config={},
        description="Built-in gridworld",
    )


@pytest.fixture
def project(db, gridworld_spec):
    from feedback_app.models import Project

    return Project.objects.create(
        name="Test project", environment=gridworld_spec, guidelines="# Be kind\nLabel carefully.", overlap=2
    )


def _member(django_user_model, project, username: str, role: str | None):
    from feedback_app.models import Membership

    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if role is not None:
        Membership.objects.create(user=user, project=project, role=role)
    return user


@pytest.fixture
def annotator(django_user_model, project):
    return _member(django_user_model, project, "annotator", "annotator")


@pytest.fixture
def other_annotator(django_user_model, project):
    return _member(django_user_model, project, "annotator2", "annotator")


@pytest.fixture
def researcher(django_user_model, project):
    return _member(django_user_model, project, "researcher", "researcher")


@pytest.fixture
def outsider(django_user_model, project):
    return _member(django_user_model, project, "outsider", None)


@pytest.fixture
def task(project):
    from feedback_app.models import Task

    return Task.objects.create(project=project, instruction="reach the goal", seed=7, spec={"seed": 7})


@pytest.fixture
def external_policy(project):
    from feedback_app.models import PolicyVersion

    return PolicyVersion.objects.create(project=project, name="agent-v1", kind="external")


@pytest.fixture
def make_trajectory(project, task, external_policy):
    """Build a small stored trajectory with `n_steps` steps."""
    from feedback_app.models import Step, Trajectory

    def make(n_steps: int = 3, **fields):
        fields.setdefault("task", task)
        fields.setdefault("policy_version", external_policy)
        fields.setdefault("source", "import")
        trajectory = Trajectory.objects.create(project=project, num_steps=n_steps, **fields)
        Step.objects.bulk_create(
            Step(trajectory=trajectory, index=i, observation=f"obs {i}", reasoning=f"think {i}", action="up")
            for i in range(n_steps)
        )
        return trajectory

    return make
