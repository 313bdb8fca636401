"""The compare page: submitting a label (stored in canonical terms, checked, once per submit, a stale tab's answer
replaced only when confirmed) and skipping an item."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from feedback_app import labelling, queue
from feedback_app.models import Assignment, Comparison, LabelKind, QueueItem
from feedback_app.models.queue import AssignmentStatus
from tests.feedback_app.compare_pages import (
    HTMX,
    compare_url,
    post_label,
    shown,
    submit_url,
    token_in,
    trajectory_shown_on,
)

pytestmark = pytest.mark.django_db


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
    QueueItem.objects.enqueue_trajectories(project, [make_trajectory(2)])
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

    QueueItem.objects.enqueue_trajectories(project, [make_trajectory(2)])
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
