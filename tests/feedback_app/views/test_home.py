"""The home page: my projects, my queue per project with links, my labels today and the guidelines."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from feedback_app import labelling, queue
from feedback_app.models import Comparison, Membership, Project, QueueItem
from feedback_app.models.queue import pairs_within_tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(project, make_trajectory):
    """Three comparisons (a pair from each of three trajectories) and two step-label items."""
    trajectories = [make_trajectory(3) for _ in range(3)]
    QueueItem.objects.enqueue_comparisons(project, pairs_within_tasks(trajectories))
    QueueItem.objects.enqueue_trajectories(project, trajectories[:2])
    return trajectories


def project_card(body: str, project) -> str:
    start = body.index(f'id="project-{project.pk}"')
    end = body.find('<li class="card project-card"', start)
    return body[start : end if end != -1 else len(body)]


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(reverse("home"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_it_shows_my_queue_per_kind_with_links_to_the_pages_that_serve_them(client, annotator, project, queued):
    client.force_login(annotator)
    body = client.get(reverse("home")).content.decode()
    card = project_card(body, project)
    compare = reverse("compare-next", args=[project.pk])
    assert re.search(rf'<a class="queue-link" href="{compare}"><strong>3</strong> comparisons →', card)
    assert re.search(r'<a class="queue-link" href="[^"]+/label/"><strong>2</strong> step labels →', card)


def test_the_counts_go_down_as_i_label_and_skip(client, annotator, project, queued):
    assignment = queue.next_assignment(annotator, project, kind="comparison")
    labelling.submit_comparison(annotator, assignment, choice="a")
    queue.skip(queue.next_assignment(annotator, project, kind="comparison"))
    client.force_login(annotator)
    card = project_card(client.get(reverse("home")).content.decode(), project)
    assert "<strong>1</strong> comparison →" in card


def test_it_counts_my_labels_of_today_of_every_kind_current_or_not(
    client, annotator, other_annotator, project, queued
):
    trajectory = queued[0]
    first = labelling.label_step(annotator, trajectory, 0, 1).label
    labelling.edit_label(annotator, first, value=-1)  # a second revision: both were made today
    labelling.label_step(annotator, trajectory, 1, 1)
    labelling.rate(annotator, trajectory, score=4)
    old = labelling.add_critique(annotator, trajectory, text="yesterday's").label
    type(old).objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    labelling.rate(other_annotator, trajectory, score=1)  # not mine
    client.force_login(annotator)
    card = project_card(client.get(reverse("home")).content.decode(), project)
    today = card[card.index("My labels today") :]
    assert "<strong>3</strong> step labels" in today
    assert "<strong>1</strong> rating" in today
    assert "critique" not in today.split("All my labels")[0].lower()


def test_it_renders_the_guidelines_safely(client, annotator, project, queued):
    project.guidelines = "# Be kind\n\nPrefer **short** paths.<script>alert(1)</script> [x](javascript:alert(2))"
    project.save()
    client.force_login(annotator)
    card = project_card(client.get(reverse("home")).content.decode(), project)
    assert "<h1>Be kind</h1>" in card and "<strong>short</strong>" in card
    assert "<script>alert" not in card and "javascript:" not in card


def test_it_lists_only_my_projects(client, annotator, project, gridworld_spec, queued):
    other = Project.objects.create(name="Secret project", environment=gridworld_spec, guidelines="secret rules")
    client.force_login(annotator)
    body = client.get(reverse("home")).content.decode()
    assert "Test project" in body
    assert "Secret project" not in body and "secret rules" not in body and f'id="project-{other.pk}"' not in body


def test_an_outsider_sees_no_project(client, outsider, project, queued):
    client.force_login(outsider)
    body = client.get(reverse("home")).content.decode()
    assert "Test project" not in body and "not a member of any project" in body


def test_a_researcher_sees_the_project_and_their_own_queue(client, researcher, annotator, project, queued):
    labelling.submit_comparison(annotator, queue.next_assignment(annotator, project, kind="comparison"), choice="a")
    client.force_login(researcher)
    card = project_card(client.get(reverse("home")).content.decode(), project)
    assert "Researcher" in card and "<strong>3</strong> comparisons" in card
    assert "My labels today" in card and Comparison.objects.count() == 1


def test_the_home_page_takes_the_same_number_of_queries_for_one_project_or_three(
    client, annotator, project, gridworld_spec, queued, make_trajectory, django_assert_max_num_queries
):
    labelling.label_step(annotator, queued[0], 0, 1)
    client.force_login(annotator)
    with django_assert_max_num_queries(8) as one:
        client.get(reverse("home"))
    for n in range(2):
        other = Project.objects.create(name=f"More {n}", environment=gridworld_spec, guidelines="*more*")
        Membership.objects.create(user=annotator, project=other, role="annotator")
    with django_assert_max_num_queries(len(one.captured_queries)):
        body = client.get(reverse("home")).content.decode()
    assert "More 0" in body and "More 1" in body
