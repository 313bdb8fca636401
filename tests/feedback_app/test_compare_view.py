"""The compare page: two trajectories side by side, one request per label, and who may see and do what."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from feedback_app import labelling, queue
from feedback_app.models import Assignment, Comparison, LabelKind, QueueItem, Step
from feedback_app.models.queue import AssignmentStatus

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def pair(make_trajectory):
    """A 3-step and a 5-step trajectory of the same task, queued for comparison."""
    short = make_trajectory(3, success=True, outcome_return=1.0)
    long = make_trajectory(5, success=False, outcome_return=0.0)
    item = queue.enqueue_comparisons(short.project, [(short, long)])[0]
    return short, long, item


@pytest.fixture
def two_pairs(pair, make_trajectory):
    third = make_trajectory(2)
    second_item = queue.enqueue_comparisons(third.project, [(pair[0], third)])[0]
    return pair[2], second_item


def compare_url(project):
    return reverse("compare-next", args=[project.pk])


def submit_url(project, assignment):
    return reverse("compare-submit", args=[project.pk, assignment.pk])


def shown(client, project, **extra) -> tuple[Assignment, str]:
    """Open the compare page; return the assignment it shows and the page."""
    response = client.get(compare_url(project), **extra)
    assert response.status_code == 200
    body = response.content.decode()
    assignment_pk = int(re.search(r"/compare/(\d+)/", body).group(1))
    return Assignment.objects.get(pk=assignment_pk), body


def token_in(body: str) -> str:
    return re.search(r'name="client_token" value="([0-9a-f-]+)"', body).group(1)


def post_label(client, project, assignment, body, **fields):
    data = {"choice": "left", "strength": "2", "rationale": "", "client_token": token_in(body), **fields}
    return client.post(submit_url(project, assignment), data, **HTMX)


def trajectory_shown_on(body: str, side: str) -> int:
    """The trajectory whose first step the page shows in the left or right column."""
    first_row = body[body.index('id="row-0"') : body.index('id="row-1"')]
    left_step, right_step = re.findall(r'id="step-(\d+)"', first_row)
    return Step.objects.get(pk=left_step if side == "left" else right_step).trajectory_id


def left_trajectory_pk(assignment) -> int:
    item = assignment.item
    a, b = item.trajectory_id, item.other_trajectory_id
    return a if labelling.displayed_order(assignment) == "ab" else b


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
    queue.enqueue_comparisons(project, [(with_map, make_trajectory(2))])
    client.force_login(annotator)
    _, body = shown(client, project)
    # A wall is a colour on screen, and the word "wall" to a screen reader.
    wall = '<td class="cell cell-wall"><span class="sr-only">wall</span></td>'
    assert f'<table class="gridmap" aria-label="map at step 1"><tr>{wall}' in body
    assert '<td class="cell cell-agent">A</td></tr><tr><td class="cell cell-goal">G</td>' in body
    assert '<td class="cell cell-other">&lt;</td>' in body  # cell text is escaped
    assert '<img src="https://example.org/shot.png" alt="screen"' in body


def test_an_annotator_in_a_blind_project_sees_neither_policy_names_nor_outcomes(client, annotator, project, pair):
    pair[0].steps.filter(index=0).update(env_reward=0.75)
    client.force_login(annotator)
    _, body = shown(client, project)
    assert "agent-v1" not in body
    assert "success" not in body and "failure" not in body and "0.75" not in body


def test_a_researcher_in_a_blind_project_does_not_see_them_either(client, researcher, project, pair):
    client.force_login(researcher)
    _, body = shown(client, project)
    assert "agent-v1" not in body and "success" not in body


def test_without_blind_review_annotators_see_policy_names_but_never_outcomes(client, annotator, project, pair):
    project.blind = False
    project.save()
    client.force_login(annotator)
    _, body = shown(client, project)
    assert "agent-v1" in body
    assert "success" not in body and "failure" not in body


def test_without_blind_review_researchers_see_outcomes(client, researcher, project, pair):
    project.blind = False
    project.save()
    client.force_login(researcher)
    _, body = shown(client, project)
    assert "success" in body and "failure" in body


def test_trajectories_without_a_policy_version_are_shown_without_a_name(client, annotator, project, make_trajectory):
    project.blind = False
    project.save()
    named, unnamed = make_trajectory(2), make_trajectory(3, policy_version=None)
    queue.enqueue_comparisons(project, [(named, unnamed)])
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
    queue.enqueue_comparisons(project, [(first, second)], query_strategy=queue.REVIEW_STRATEGY)
    client.force_login(researcher)
    _, body = shown(client, project)
    assert "agent-v1" not in body and "success" not in body and "failure" not in body


def test_gold_items_look_exactly_like_the_rest(client, annotator, project, make_trajectory):
    first, second = make_trajectory(2), make_trajectory(2)
    QueueItem.objects.create(
        project=project,
        kind="comparison",
        trajectory=first,
        other_trajectory=second,
        is_gold=True,
        gold_answer={"choice": "a"},
        overlap=2,
    )
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
    fields = {"choice": "left", "strength": "2", "client_token": token_in(body)}
    assert client.post(reverse("compare-submit", args=[project.pk, huge]), fields, **HTMX).status_code == 404
    assert Comparison.objects.count() == 0


# Submitting ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_submit_stores_the_choice_in_canonical_terms_and_answers_with_the_next_item(
    client, annotator, project, two_pairs, side
):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    response = post_label(client, project, assignment, body, choice=side, strength="3", rationale=" shorter path ")
    assert response.status_code == 200
    label = Comparison.objects.get()
    order = labelling.displayed_order(assignment)
    assert label.displayed_order == order
    chosen_pk = trajectory_shown_on(body, side)  # read off the page the annotator saw
    assert label.choice == ("a" if chosen_pk == label.trajectory_a_id else "b")
    assert (label.strength, label.rationale, label.annotator) == (3, "shorter path", annotator)
    assignment.refresh_from_db()
    assert assignment.status == AssignmentStatus.DONE
    next_body = response.content.decode()
    assert next_body.lstrip().startswith('<div id="workspace"')
    next_assignment = Assignment.objects.get(annotator=annotator, status=AssignmentStatus.LEASED)
    assert next_assignment.item_id != assignment.item_id
    assert submit_url(project, next_assignment) in next_body


@pytest.mark.parametrize("choice", ["tie", "both_bad"])
def test_tie_and_both_bad_are_stored_as_they_are(client, annotator, project, pair, choice):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    assert post_label(client, project, assignment, body, choice=choice).status_code == 200
    assert Comparison.objects.get().choice == choice


def test_a_double_submit_stores_one_label(client, annotator, project, two_pairs):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    first = post_label(client, project, assignment, body, choice="right")
    second = post_label(client, project, assignment, body, choice="right")
    assert first.status_code == second.status_code == 200
    assert Comparison.objects.count() == 1
    assert QueueItem.objects.get(pk=assignment.item_id).completed_count == 1
    # The repeat shows the next item the first submit leased, and leases nothing more.
    served = [re.search(r"/compare/(\d+)/", response.content.decode()).group(1) for response in (first, second)]
    assert served[0] == served[1] != str(assignment.pk)
    assert Assignment.objects.filter(annotator=annotator, status=AssignmentStatus.LEASED).count() == 1


def test_without_htmx_a_submit_redirects_to_the_next_item(client, annotator, project, pair):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    data = {"choice": "tie", "strength": "1", "client_token": token_in(body)}
    response = client.post(submit_url(project, assignment), data)
    assert response.status_code == 303 and response["Location"] == compare_url(project)
    assert Comparison.objects.count() == 1


@pytest.mark.parametrize(("choice", "strength"), [("tie", "3"), ("both_bad", ""), ("tie", None)])
def test_a_tie_or_both_bad_is_stored_without_a_strength(client, annotator, project, pair, choice, strength):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    data = {"choice": choice, "client_token": token_in(body)}
    if strength is not None:
        data["strength"] = strength
    response = client.post(submit_url(project, assignment), data)
    assert response.status_code == 303
    assert Comparison.objects.get().strength is None


def test_a_preference_without_a_strength_gets_400_beside_the_field(client, annotator, project, pair):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    response = client.post(submit_url(project, assignment), {"choice": "left", "client_token": token_in(body)})
    assert response.status_code == 400
    assert 'id="strength-error">Strength is 1 (slight), 2 (clear) or 3 (decisive).' in response.content.decode()
    assert not Comparison.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"choice": "up"}, "choice", "Choose left, right, tie or both bad."),
        ({"choice": ""}, "choice", "Choose left, right, tie or both bad."),
        ({"strength": "5"}, "strength", "Strength is 1 (slight), 2 (clear) or 3 (decisive)."),
        ({"strength": "strong"}, "strength", "Strength is 1 (slight), 2 (clear) or 3 (decisive)."),
    ],
)
def test_an_invalid_choice_or_strength_gets_400_with_the_message_beside_the_field(
    client, annotator, project, pair, fields, field, message
):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    response = post_label(client, project, assignment, body, rationale="kept text", **fields)
    assert response.status_code == 400
    page = response.content.decode()
    assert f'<p class="field-error" id="{field}-error">{message}</p>' in page
    assert "kept text</textarea>" in page
    assert token_in(page) == token_in(body)  # a retry stays idempotent
    assert Comparison.objects.count() == 0
    assignment.refresh_from_db()
    assert assignment.status == AssignmentStatus.LEASED


def test_an_annotator_cannot_submit_on_another_annotators_assignment(
    client, annotator, other_annotator, project, pair
):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    client.force_login(other_annotator)
    assert post_label(client, project, assignment, body).status_code == 404
    assert Comparison.objects.count() == 0


def test_a_submit_on_an_item_of_another_kind_gets_404_and_stores_nothing(client, annotator, project, make_trajectory):
    queue.enqueue_trajectories(project, [make_trajectory(2)])
    step_item = queue.next_assignment(annotator, project, kind=LabelKind.STEP_LABEL)
    client.force_login(annotator)
    data = {"choice": "left", "strength": "2", "client_token": str(uuid.uuid4())}
    response = client.post(submit_url(project, step_item), data, **HTMX)
    assert response.status_code == 404 and Comparison.objects.count() == 0
    step_item.refresh_from_db()
    assert step_item.status == AssignmentStatus.LEASED


def test_a_researcher_may_label_too(client, researcher, project, pair):
    client.force_login(researcher)
    assignment, body = shown(client, project)
    assert post_label(client, project, assignment, body, choice="tie").status_code == 200
    assert Comparison.objects.get().annotator == researcher


def test_a_post_without_the_csrf_token_is_refused(annotator, project, pair):
    client = Client(enforce_csrf_checks=True)
    client.force_login(annotator)
    assignment, body = shown(client, project)
    data = {"choice": "left", "strength": "2", "client_token": token_in(body)}
    assert client.post(submit_url(project, assignment), data, **HTMX).status_code == 403
    skip = reverse("assignment-skip", args=[project.pk, assignment.pk])
    assert client.post(skip, {"reason": "x"}).status_code == 403
    assert Comparison.objects.count() == 0
    # The token the page carries is accepted.
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body).group(1)
    response = client.post(submit_url(project, assignment), {**data, "csrfmiddlewaretoken": csrf}, **HTMX)
    assert response.status_code == 200
    assert Comparison.objects.count() == 1


def test_a_lost_lease_shows_its_message_and_the_next_item(
    client, annotator, other_annotator, project, two_pairs, django_user_model
):
    from feedback_app.models import Membership

    client.force_login(annotator)
    assignment, body = shown(client, project)
    # The lease runs out; two others take and fill the item's two slots meanwhile.
    Assignment.objects.filter(pk=assignment.pk).update(leased_until=timezone.now() - timedelta(minutes=1))
    third = django_user_model.objects.create_user(username="annotator3", password="pw")
    Membership.objects.create(user=third, project=project, role="annotator")
    for user in (other_annotator, third):
        taken = queue.next_assignment(user, project)
        assert taken.item_id == assignment.item_id
        labelling.submit_comparison(user, taken, choice="a")
    response = post_label(client, project, assignment, body)
    assert response.status_code == 409
    page = response.content.decode()
    assert "Your lease on this item expired" in page
    assert not Comparison.objects.filter(annotator=annotator).exists()
    following = Assignment.objects.get(annotator=annotator, status=AssignmentStatus.LEASED)
    assert following.item_id != assignment.item_id and submit_url(project, following) in page


# Skipping ------------------------------------------------------------------------------------------------------------


def test_skipping_records_the_reason_and_serves_the_next_item_of_the_same_kind(client, annotator, project, two_pairs):
    client.force_login(annotator)
    assignment, _ = shown(client, project)
    skip = reverse("assignment-skip", args=[project.pk, assignment.pk])
    response = client.post(skip, {"reason": "  cannot tell  "}, **HTMX)
    assert response.status_code == 303 and response["Location"] == compare_url(project)
    assignment.refresh_from_db()
    assert (assignment.status, assignment.skip_reason) == (AssignmentStatus.SKIPPED, "cannot tell")
    following, body = shown(client, project, **HTMX)
    assert following.item_id != assignment.item_id
    assert body.lstrip().startswith('<div id="workspace"')
    # Skipping again changes nothing, and the skipped item never comes back.
    client.post(skip, {"reason": "other"})
    assignment.refresh_from_db()
    assert assignment.skip_reason == "cannot tell"


def test_skipping_without_a_reason_is_fine(client, annotator, project, pair):
    client.force_login(annotator)
    assignment, _ = shown(client, project)
    client.post(reverse("assignment-skip", args=[project.pk, assignment.pk]))
    assignment.refresh_from_db()
    assert (assignment.status, assignment.skip_reason) == (AssignmentStatus.SKIPPED, "")
    assert "Nothing left to compare" in client.get(compare_url(project)).content.decode()


def test_skipping_a_step_label_item_goes_on_to_the_step_label_page(client, annotator, project, make_trajectory):
    from feedback_app.views.workspace import next_item_url

    queue.enqueue_trajectories(project, [make_trajectory(2)])
    assignment = queue.next_assignment(annotator, project, kind="step_label")
    client.force_login(annotator)
    response = client.post(reverse("assignment-skip", args=[project.pk, assignment.pk]), {"reason": "unclear"})
    assert response.status_code == 303
    assert response["Location"] == next_item_url(project.pk, "step_label") == reverse("label-next", args=[project.pk])
    assert Assignment.objects.get(pk=assignment.pk).status == AssignmentStatus.SKIPPED


def test_a_labelled_item_stays_labelled_when_skip_is_pressed_late(client, annotator, project, two_pairs):
    client.force_login(annotator)
    assignment, body = shown(client, project)
    post_label(client, project, assignment, body)
    client.post(reverse("assignment-skip", args=[project.pk, assignment.pk]), {"reason": "late"})
    assignment.refresh_from_db()
    assert assignment.status == AssignmentStatus.DONE and assignment.skip_reason == ""


def test_an_annotator_cannot_skip_another_annotators_assignment(client, annotator, other_annotator, project, pair):
    assignment = queue.next_assignment(annotator, project)
    client.force_login(other_annotator)
    assert client.post(reverse("assignment-skip", args=[project.pk, assignment.pk])).status_code == 404
    assert Assignment.objects.get(pk=assignment.pk).status == AssignmentStatus.LEASED


def test_the_skip_url_answers_only_post(client, annotator, project, pair):
    assignment = queue.next_assignment(annotator, project)
    client.force_login(annotator)
    assert client.get(reverse("assignment-skip", args=[project.pk, assignment.pk])).status_code == 405


# Queries ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("htmx", [False, True])
def test_showing_and_submitting_take_the_same_number_of_queries_for_short_and_long_trajectories(
    client, annotator, project, make_trajectory, django_assert_max_num_queries, htmx
):
    extra = HTMX if htmx else {}
    project.gold_fraction = 0  # no coin toss for gold items, so both rounds take the same path
    project.save()
    for n_steps in (3, 3, 12, 12):
        queue.enqueue_comparisons(project, [(make_trajectory(n_steps), make_trajectory(n_steps))])
    client.force_login(annotator)

    def submit():
        assignment = Assignment.objects.get(annotator=annotator, status=AssignmentStatus.LEASED)
        data = {"choice": "left", "strength": "2", "client_token": str(uuid.uuid4())}
        return client.post(submit_url(project, assignment), data, **extra)

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

    from feedback_app.views import compare

    monkeypatch.setattr(compare, "_STEP_CACHE", OrderedDict())
    monkeypatch.setattr(compare, "_step_cache_characters", 0)
    trajectories = [make_trajectory(3) for _ in range(4)]
    first = compare._rendered_steps(trajectories[0], False)
    with django_assert_num_queries(0):
        assert compare._rendered_steps(trajectories[0], False) == first
    one = sum(map(len, first.values()))
    monkeypatch.setattr(compare, "STEP_CACHE_CHARACTERS", 2 * one + one // 2)  # room for two
    for trajectory in trajectories[1:]:
        compare._rendered_steps(trajectory, False)
    assert [key[0] for key in compare._STEP_CACHE] == [t.pk for t in trajectories[2:]]
    assert compare._step_cache_characters == sum(size for _, size in compare._STEP_CACHE.values())


def test_a_stale_second_tab_is_told_of_the_stored_answer_and_replaces_it_only_when_confirmed(
    client, annotator, project, pair
):
    client.force_login(annotator)
    assignment, first_tab = shown(client, project)
    again, second_tab = shown(client, project)  # a reload resumes the same item, with its own form token
    assert again == assignment and token_in(first_tab) != token_in(second_tab)
    assert post_label(client, project, assignment, first_tab, choice="left", strength="3").status_code == 200
    stored = Comparison.objects.get()

    # The first tab's own submit repeated is the same answer, not a replacement.
    assert post_label(client, project, assignment, first_tab, choice="left", strength="3").status_code == 200
    stale = post_label(client, project, assignment, second_tab, choice="right")
    assert stale.status_code == 409
    body = stale.content.decode()
    assert "You already answered this pair, in another tab or an earlier visit: left is better (decisive)." in body
    assert f'name="replaces" value="{stored.pk}"' in body and 'value="right" checked' in body
    assert list(Comparison.objects.values_list("pk", "is_current")) == [(stored.pk, True)]

    confirmed = post_label(client, project, assignment, body, choice="right", replaces=str(stored.pk))
    assert confirmed.status_code == 200
    current = Comparison.objects.get(is_current=True)
    assert (current.revision, current.supersedes_id) == (2, stored.pk)
    assert labelling.shown_choice(current.choice, current.displayed_order) == "right"
