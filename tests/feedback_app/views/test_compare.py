"""The compare page: two trajectories side by side, one request per label, and who may see and do what; showing an
item, and what showing and submitting cost in queries. Submitting and skipping are test_compare_submit.py."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from feedback_app.models import Assignment, Comparison, QueueItem, Step
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.queue import AssignmentStatus
from tests.feedback_app import compare_pages
from tests.feedback_app.compare_pages import (
    HTMX,
    compare_url,
    left_trajectory_pk,
    post_label,
    shown,
    trajectory_shown_on,
)
from tests.feedback_app.labels import gold_comparison_item

pytestmark = pytest.mark.django_db


# Showing an item -----------------------------------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_log_in(client, project, pair):
    response = client.get(compare_url(project))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_it_shows_both_trajectories_aligned_step_by_step_with_episode_ended_cells(client, annotator, project, pair):
    short, long, _ = pair
    client.force_login(annotator)
    assignment, body = shown(client, project)
    rows = re.findall(r'<div class="compare-row" role="row" id="row-(\d+)"', body)
    assert rows == ["0", "1", "2", "3", "4"]
    assert body.count("episode ended") == 2
    assert "reach the goal" in body and "think 4" in body and "obs 2" in body
    # Row i holds step i of the left trajectory, then step i of the right one; the left one is the one the
    # assignment's displayed order puts there.
    left = left_trajectory_pk(assignment)
    right = long if left == short.pk else short
    assert trajectory_shown_on(body, "left") == left and trajectory_shown_on(body, "right") == right.pk
    for index in range(5):
        row = re.search(rf'id="row-{index}".*?(?=id="row-{index + 1}"|class="decision-bar")', body, re.S).group(0)
        expected = [f"step-{step.pk}" for step in Step.objects.filter(trajectory__in=[left, right.pk], index=index)]
        shown_ids = re.findall(r'id="(step-\d+)"', row)
        assert sorted(shown_ids) == sorted(expected)
        assert ("episode ended" in row) == (index >= 3)
    last = re.search(r'id="row-4".*?class="decision-bar"', body, re.S).group(0)
    ended_side = "left" if left == short.pk else "right"
    cells = re.findall(r'<div class="compare-cell" role="cell">(.*?)</div>\n', last, re.S)
    assert "episode ended" in cells[0 if ended_side == "left" else 1]


def test_a_reload_resumes_the_same_item(client, annotator, project, two_pairs):
    client.force_login(annotator)
    first, _ = shown(client, project)
    again, _ = shown(client, project)
    assert first.pk == again.pk
    assert Assignment.objects.filter(annotator=annotator).count() == 1


def test_it_renders_the_grid_map_and_step_images(client, annotator, project, make_trajectory):
    with_map = make_trajectory(2)
    with_map.steps.filter(index=0).update(
        render={"kind": "grid", "rows": [["#", "A"], ["G", "<"]]},
        media=[{"type": "image", "url": "https://example.org/shot.png", "caption": "screen"}],
    )
    QueueItem.objects.enqueue_comparisons(project, [(with_map, make_trajectory(2))])
    client.force_login(annotator)
    _, body = shown(client, project)
    # A wall is a colour on screen, and the word "wall" to a screen reader.
    wall = '<td class="cell cell-wall"><span class="sr-only">wall</span></td>'
    assert f'<table class="gridmap" aria-label="map at step 1"><tr>{wall}' in body
    assert '<td class="cell cell-agent">A</td></tr><tr><td class="cell cell-goal">G</td>' in body
    assert '<td class="cell cell-other">&lt;</td>' in body  # cell text is escaped
    assert '<img src="https://example.org/shot.png" alt="screen"' in body


@pytest.mark.parametrize(
    ("role", "blind", "sees_names", "sees_outcomes"),
    [
        ("annotator", True, False, False),
        ("researcher", True, False, False),
        ("annotator", False, True, False),
        ("researcher", False, True, True),
    ],
    ids=["blind-annotator", "blind-researcher", "open-annotator", "open-researcher"],
)
def test_blind_review_hides_policy_names_and_outcomes_and_annotators_never_see_outcomes(
    request, client, project, pair, role, blind, sees_names, sees_outcomes
):
    pair[0].steps.filter(index=0).update(env_reward=0.75)
    project.blind = blind
    project.save()
    client.force_login(request.getfixturevalue(role))
    _, body = shown(client, project)
    assert ("agent-v1" in body) == sees_names
    for outcome in ("success", "failure", "0.75"):
        assert (outcome in body) == sees_outcomes, outcome


def test_trajectories_without_a_policy_version_are_shown_without_a_name(client, annotator, project, make_trajectory):
    project.blind = False
    project.save()
    named, unnamed = make_trajectory(2), make_trajectory(3, policy_version=None)
    QueueItem.objects.enqueue_comparisons(project, [(named, unnamed)])
    client.force_login(annotator)
    _, body = shown(client, project)
    assert body.count("agent-v1") == 1
    assert {trajectory_shown_on(body, "left"), trajectory_shown_on(body, "right")} == {named.pk, unnamed.pk}


def test_a_new_versions_comparison_against_its_parent_is_blind_even_in_an_open_project(
    client, researcher, project, make_trajectory
):
    project.blind = False
    project.save()
    first, second = make_trajectory(3, success=True), make_trajectory(4, success=False)
    QueueItem.objects.enqueue_comparisons(project, [(first, second)], query_strategy=QueryStrategy.NEW_VS_PARENT)
    client.force_login(researcher)
    _, body = shown(client, project)
    assert "agent-v1" not in body and "success" not in body and "failure" not in body


def test_gold_items_look_exactly_like_the_rest(client, annotator, project, make_trajectory):
    gold_comparison_item(project, make_trajectory(2), make_trajectory(2), "a", overlap=2)
    client.force_login(annotator)
    assignment, body = shown(client, project)
    assert assignment.item.is_gold
    assert "gold" not in body.lower()


def test_an_empty_queue_says_so_and_links_home(client, annotator, project):
    client.force_login(annotator)
    response = client.get(compare_url(project))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Nothing left to compare" in body and f'href="{reverse("home")}"' in body
    assert "compare-form" not in body


def test_an_htmx_request_gets_only_the_workspace_fragment(client, annotator, project, pair):
    client.force_login(annotator)
    response = client.get(compare_url(project), **HTMX)
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="workspace"') and "<html" not in body


def test_an_outsider_gets_404_for_the_page_the_submit_and_the_skip(client, annotator, outsider, project, pair):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    client.force_login(outsider)
    assert client.get(compare_url(project)).status_code == 404
    assert post_label(client, project, assignment, body).status_code == 404
    skip = reverse("assignment-skip", args=[project.pk, assignment.pk])
    assert client.post(skip, {"reason": "x"}).status_code == 404
    assert Comparison.objects.count() == 0
    assert Assignment.objects.get(pk=assignment.pk).status == AssignmentStatus.LEASED


def test_ids_beyond_any_database_id_get_404(client, annotator, project, pair):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    huge = 2**64
    assert client.get(compare_url(project).replace(f"/{project.pk}/", f"/{huge}/")).status_code == 404
    fields = {"choice": "left", "strength": "2", "client_token": compare_pages.token_in(body)}
    assert client.post(reverse("compare-submit", args=[project.pk, huge]), fields, **HTMX).status_code == 404
    assert Comparison.objects.count() == 0


# Queries ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("htmx", [False, True])
def test_showing_and_submitting_take_the_same_number_of_queries_for_short_and_long_trajectories(
    client, annotator, project, make_trajectory, django_assert_max_num_queries, htmx
):
    extra = HTMX if htmx else {}
    project.gold_fraction = 0  # no coin toss for gold items, so both rounds take the same path
    project.save()
    for n_steps in (3, 3, 12, 12):
        QueueItem.objects.enqueue_comparisons(project, [(make_trajectory(n_steps), make_trajectory(n_steps))])
    client.force_login(annotator)

    def submit():
        assignment = Assignment.objects.get(annotator=annotator, status=AssignmentStatus.LEASED)
        data = {"choice": "left", "strength": "2", "client_token": str(uuid.uuid4())}
        return client.post(compare_pages.submit_url(project, assignment), data, **extra)

    client.get(compare_url(project), **extra)  # leases the first 3-step pair
    with django_assert_max_num_queries(30) as submit_short:
        submit()  # stores it and serves the second 3-step pair
    with django_assert_max_num_queries(15) as page_short:
        client.get(compare_url(project), **extra)
    with django_assert_max_num_queries(len(submit_short.captured_queries)):
        response = submit()  # stores it and serves a 12-step pair (without htmx: redirects to it)
    if htmx:
        assert response.content.decode().count('class="compare-row" role="row"') == 12
    with django_assert_max_num_queries(len(page_short.captured_queries)):
        response = client.get(compare_url(project), **extra)
    assert response.content.decode().count('class="compare-row" role="row"') == 12
    assert Comparison.objects.count() == 2


def prepared_statements() -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("prepared", [True, False])
def test_on_postgresql_the_submit_and_next_statements_are_prepared_unless_switched_off(
    client, annotator, project, two_pairs, settings, prepared
):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are a PostgreSQL matter")
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    client.force_login(annotator)
    before = set(prepared_statements())
    assignment, body = shown(client, project)
    assert post_label(client, project, assignment, body).status_code == 200
    new = set(prepared_statements()) - before
    leasing = [sql for sql in new if "feedback_app_queueitem" in sql and "SKIP LOCKED" in sql]
    storing = [sql for sql in new if 'INSERT INTO "feedback_app_comparison"' in sql]
    if prepared:
        assert leasing and storing
    else:
        assert not new
    assert Comparison.objects.filter(annotator=annotator).count() == 1


def test_rendered_steps_are_reused_and_kept_within_their_budget(
    project, make_trajectory, monkeypatch, django_assert_num_queries
):
    from collections import OrderedDict

    from feedback_app.hot_path import reads
    from feedback_app.views import compare

    monkeypatch.setattr(reads, "_STEP_CACHE", OrderedDict())
    monkeypatch.setattr(reads, "_step_cache_characters", 0)
    trajectories = [make_trajectory(3) for _ in range(4)]
    first = compare._rendered_steps(trajectories[0], False)
    with django_assert_num_queries(0):
        assert compare._rendered_steps(trajectories[0], False) == first
    one = sum(map(len, first.values()))
    monkeypatch.setattr(reads, "STEP_CACHE_CHARACTERS", 2 * one + one // 2)  # room for two
    for trajectory in trajectories[1:]:
        compare._rendered_steps(trajectory, False)
    assert [key[0] for key in reads._STEP_CACHE] == [t.pk for t in trajectories[2:]]
    assert reads._step_cache_characters == sum(size for _, size in reads._STEP_CACHE.values())
