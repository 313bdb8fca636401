"""Who sees what on the project pages: members see their projects, annotators never see hidden outcomes, outsiders
get 404."""

from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def rolled_out(make_trajectory):
    trajectory = make_trajectory(n_steps=2, success=True, outcome_return=0.9, external_id="ep-visible")
    trajectory.steps.filter(index=1).update(env_reward=1.0, done=True)
    return trajectory


def test_anonymous_users_are_sent_to_log_in(client, project):
    response = client.get(reverse("project-detail", args=[project.pk]))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_home_lists_only_my_projects(client, annotator, project, gridworld_spec):
    from feedback_app.models import Project

    Project.objects.create(name="Secret project", environment=gridworld_spec)
    client.force_login(annotator)
    response = client.get(reverse("home"))
    assert response.status_code == 200
    assert b"Test project" in response.content and b"Secret project" not in response.content


def test_an_outsider_gets_404_for_a_project_and_its_trajectories(client, outsider, project, rolled_out):
    client.force_login(outsider)
    assert client.get(reverse("project-detail", args=[project.pk])).status_code == 404
    assert client.get(reverse("trajectory-detail", args=[project.pk, rolled_out.pk])).status_code == 404


def test_a_researcher_sees_trajectories_outcomes_and_policies(client, researcher, project, rolled_out):
    client.force_login(researcher)
    response = client.get(reverse("project-detail", args=[project.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    assert f'id="trajectory-{rolled_out.pk}"' in body
    assert "success" in body and "agent-v1" in body
    trajectory_page = client.get(reverse("trajectory-detail", args=[project.pk, rolled_out.pk])).content.decode()
    assert "reward 1.0" in trajectory_page


def test_an_annotator_in_a_blind_project_sees_neither_outcomes_nor_policy_names(
    client, annotator, project, rolled_out
):
    client.force_login(annotator)
    for url in (
        reverse("project-detail", args=[project.pk]),
        reverse("trajectory-detail", args=[project.pk, rolled_out.pk]),
    ):
        body = client.get(url).content.decode()
        assert "agent-v1" not in body
        assert "success" not in body
        assert "reward 1.0" not in body
    trajectory_page = client.get(reverse("trajectory-detail", args=[project.pk, rolled_out.pk])).content.decode()
    assert "think 1" in trajectory_page  # the steps themselves are shown


def test_a_trajectory_of_another_project_is_not_reachable_through_mine(
    client, annotator, project, gridworld_spec, django_user_model
):
    from feedback_app.models import Project, Task, Trajectory

    other = Project.objects.create(name="Other", environment=gridworld_spec)
    task = Task.objects.create(project=other, instruction="x")
    foreign = Trajectory.objects.create(project=other, task=task, source="human")
    client.force_login(annotator)
    assert client.get(reverse("trajectory-detail", args=[project.pk, foreign.pk])).status_code == 404


def test_the_project_page_makes_a_constant_number_of_queries(
    client, researcher, project, make_trajectory, django_assert_max_num_queries
):
    for _ in range(3):
        make_trajectory()
    client.force_login(researcher)
    with django_assert_max_num_queries(12) as few:
        client.get(reverse("project-detail", args=[project.pk]))
    for _ in range(20):
        make_trajectory()
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get(reverse("project-detail", args=[project.pk]))
