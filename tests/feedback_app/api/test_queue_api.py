"""The queue over the API: lease the next item, skip it, hand in a step-label item; the same queue, leases and
left/right order as the annotator pages, for members only."""

from __future__ import annotations

import pytest

from feedback_app import labelling, queue
from feedback_app.models import Assignment, Comparison, Critique, QueueItem, StepLabel

pytestmark = pytest.mark.django_db


def _url(project, path: str) -> str:
    return f"/api/projects/{project.pk}/{path}"


@pytest.fixture
def items(project, make_trajectory):
    """A comparison item at high priority and a step_label item of a 3-step trajectory."""
    first, second = make_trajectory(n_steps=2), make_trajectory(n_steps=2)
    (comparison,) = QueueItem.objects.enqueue_comparisons(
        project, [(first, second)], priority=5, query_strategy="uncertainty"
    )
    (review,) = QueueItem.objects.enqueue_trajectories(
        project, [make_trajectory(n_steps=3)], query_strategy="disagreement"
    )
    return comparison, review


def test_next_leases_the_highest_priority_item_with_what_a_client_needs(project, items, annotator, api_as):
    comparison, _ = items
    response = api_as(annotator).post(_url(project, "assignments/next/"), {})
    assert response.status_code == 200, response.json()
    body = response.json()
    assignment = Assignment.objects.get(pk=body["id"])
    assert (assignment.item, assignment.annotator, assignment.status) == (comparison, annotator, "leased")
    assert (body["kind"], body["task"], body["status"]) == ("comparison", comparison.trajectory.task_id, "leased")
    assert body["leased_until"] and body["item"]["trajectory"] == comparison.trajectory_id
    # Left and right as the compare page shows them for this assignment.
    order = labelling.displayed_order(assignment)
    pair = [comparison.trajectory_id, comparison.other_trajectory_id]
    assert body["displayed_order"] == order
    assert body["trajectories"] == (pair if order == "ab" else pair[::-1])
    # Annotators are not told which items are gold.
    assert "is_gold" not in body["item"] and "gold_answer" not in body["item"]


def test_next_resumes_the_current_lease_and_filters_by_kind(project, items, annotator, api_as):
    _, review = items
    client = api_as(annotator)
    first = client.post(_url(project, "assignments/next/"), {}).json()
    assert client.post(_url(project, "assignments/next/"), {}).json()["id"] == first["id"]
    step_item = client.post(_url(project, "assignments/next/"), {"kind": "step_label"}).json()
    assert (step_item["kind"], step_item["trajectories"], step_item["displayed_order"]) == (
        "step_label",
        [review.trajectory_id],
        None,
    )


def test_next_answers_204_when_nothing_is_left_for_the_caller(project, items, annotator, api_as):
    client = api_as(annotator)
    assert client.post(_url(project, "assignments/next/"), {"kind": "rating"}).status_code == 204
    for _ in range(2):
        leased = client.post(_url(project, "assignments/next/"), {}).json()
        assert client.post(_url(project, f"assignments/{leased['id']}/skip/"), {}).status_code == 200
    response = client.post(_url(project, "assignments/next/"), {})
    assert response.status_code == 204 and not response.content


def test_next_refuses_an_unknown_kind_naming_the_field(project, items, annotator, api_as):
    response = api_as(annotator).post(_url(project, "assignments/next/"), {"kind": "essay"})
    assert response.status_code == 400 and "kind" in response.json()
    assert not Assignment.objects.exists()


def test_outsiders_get_404_and_read_only_tokens_403_from_the_queue(
    project, items, annotator, outsider, api_as, token_client
):
    mine = queue.next_assignment(annotator, project)
    outside = api_as(outsider)
    assert outside.post(_url(project, "assignments/next/"), {}).status_code == 404
    assert outside.post(_url(project, f"assignments/{mine.pk}/skip/"), {}).status_code == 404
    assert outside.post(_url(project, f"assignments/{mine.pk}/finish/"), {}).status_code == 404
    assert token_client(annotator, read_only=True).post(_url(project, "assignments/next/"), {}).status_code == 403
    from rest_framework.test import APIClient

    assert APIClient().post(_url(project, "assignments/next/"), {}).status_code == 401
    assert Assignment.objects.count() == 1


def test_a_member_cannot_skip_or_finish_someone_elses_assignment(
    project, items, annotator, other_annotator, researcher, api_as
):
    theirs = queue.next_assignment(other_annotator, project)
    for user in (annotator, researcher):
        assert api_as(user).post(_url(project, f"assignments/{theirs.pk}/skip/"), {}).status_code == 404
        assert api_as(user).post(_url(project, f"assignments/{theirs.pk}/finish/"), {}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == "leased"


def test_an_api_token_user_leases_labels_and_the_label_completes_the_item(project, items, annotator, token_client):
    comparison, _ = items
    client = token_client(annotator)
    leased = client.post(_url(project, "assignments/next/"), {"kind": "comparison"}).json()
    left, right = leased["trajectories"]
    body = {
        "trajectory_a": left,
        "trajectory_b": right,
        "displayed_order": "ab",
        "choice": "a",  # the left one
        "assignment": leased["id"],
        "client_token": "6f1c1d38-5d1e-4a44-8a59-3b8e6c1f2a10",
    }
    assert client.post(_url(project, "comparisons/"), body).status_code == 201
    label = Comparison.objects.get()
    assert label.trajectory_a_id < label.trajectory_b_id
    assert label.displayed_order == labelling.displayed_order(label.assignment)
    assert labelling.shown_choice(label.choice, label.displayed_order) == "left"
    assert label.query_strategy == "uncertainty"
    comparison.refresh_from_db()
    assert comparison.completed_count == 1 and label.assignment.status == "done"


def test_skip_records_the_reason_and_the_item_is_not_served_again(project, items, annotator, api_as):
    comparison, _ = items
    client = api_as(annotator)
    leased = client.post(_url(project, "assignments/next/"), {"kind": "comparison"}).json()
    refused = client.post(_url(project, f"assignments/{leased['id']}/skip/"), {"reason": "x" * 201})
    assert refused.status_code == 400 and "reason" in refused.json()
    response = client.post(_url(project, f"assignments/{leased['id']}/skip/"), {"reason": "  both look the same "})
    assert response.status_code == 200 and response.json()["status"] == "skipped"
    assignment = Assignment.objects.get(pk=leased["id"])
    assert (assignment.status, assignment.skip_reason) == ("skipped", "both look the same")
    assert client.post(_url(project, f"assignments/{leased['id']}/skip/"), {}).status_code == 200
    assert client.post(_url(project, "assignments/next/"), {"kind": "comparison"}).status_code == 204
    assert queue.next_assignment(annotator, project, kind="comparison") is None
    comparison.refresh_from_db()
    assert comparison.completed_count == 0


def test_a_labelled_item_cannot_be_skipped(project, items, annotator, api_as):
    assignment = queue.next_assignment(annotator, project, kind="comparison")
    labelling.submit_comparison(annotator, assignment, choice="a")
    response = api_as(annotator).post(_url(project, f"assignments/{assignment.pk}/skip/"), {"reason": "oops"})
    assert response.status_code == 409
    assignment.refresh_from_db()
    assert assignment.status == "done"


def test_a_step_item_is_handed_in_with_finish_once_its_steps_are_labelled(project, items, annotator, api_as):
    _, review = items
    client = api_as(annotator)
    leased = client.post(_url(project, "assignments/next/"), {"kind": "step_label"}).json()
    steps = list(review.trajectory.steps.order_by("index"))
    finish = _url(project, f"assignments/{leased['id']}/finish/")

    label = {"step": steps[0].pk, "value": 1, "assignment": leased["id"]}
    assert client.post(_url(project, "step-labels/"), label).status_code == 201
    # One step label does not hand the item in: as on the step page, Finish does.
    assert Assignment.objects.get(pk=leased["id"]).status == "leased"
    refused = client.post(finish, {})
    assert refused.status_code == 400 and "steps" in refused.json()
    critique = {"trajectory": review.trajectory_id, "text": "step 2 loops", "assignment": leased["id"]}
    assert client.post(_url(project, "critiques/"), critique).status_code == 201
    assert client.post(_url(project, "step-labels/"), {**label, "step": steps[1].pk, "value": -1}).status_code == 201

    response = client.post(finish, {})
    assert response.status_code == 200 and response.json()["status"] == "done"
    review.refresh_from_db()
    assert review.completed_count == 1
    assert set(StepLabel.objects.values_list("query_strategy", flat=True)) == {"disagreement"}
    assert Critique.objects.get().query_strategy == "disagreement"
    assert client.post(finish, {}).status_code == 200  # handing in twice changes nothing
    review.refresh_from_db()
    assert review.completed_count == 1


def test_finish_refuses_a_comparison_and_a_skipped_item(project, items, annotator, api_as):
    client = api_as(annotator)
    comparison = queue.next_assignment(annotator, project, kind="comparison")
    response = client.post(_url(project, f"assignments/{comparison.pk}/finish/"), {})
    assert response.status_code == 400 and "assignment" in response.json()
    review = queue.next_assignment(annotator, project, kind="step_label")
    queue.skip(review, "unclear")
    assert client.post(_url(project, f"assignments/{review.pk}/finish/"), {}).status_code == 409
    review.refresh_from_db()
    assert review.status == "skipped"
    assert QueueItem.objects.filter(completed_count__gt=0).count() == 0


def test_a_label_for_another_trajectory_cannot_answer_a_step_item(project, items, annotator, api_as):
    comparison, _ = items
    review = queue.next_assignment(annotator, project, kind="step_label")
    body = {"trajectory": comparison.trajectory_id, "text": "wrong one", "assignment": review.pk}
    response = api_as(annotator).post(_url(project, "critiques/"), body)
    assert response.status_code == 400 and "another item" in response.json()["assignment"][0]


def test_the_project_exposes_how_its_environment_is_built(project, annotator, api_as):
    body = api_as(annotator).get(_url(project, "")).json()
    assert body["environment_spec"] == {
        "name": "gridworld-test",
        "dotted_path": "reward_models.envs.gridworld.GridWorld",
        "config": {},
    }
