"""The step-label page: the queue's next item, one request per label, "first error here", submit & next, and who may
see and change what."""

from __future__ import annotations

import re
import uuid

import pytest
from django.test import Client
from django.urls import reverse

from feedback_app import labelling, queue
from feedback_app.models import QueueItem, StepLabel
from feedback_app.models.queue import AssignmentStatus
from tests.feedback_app.gridworld_play import SEED_7_ACTIONS, play_gridworld

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def trajectory(make_trajectory):
    return make_trajectory(4)


@pytest.fixture
def assignment(project, annotator, trajectory):
    QueueItem.objects.enqueue_trajectories(project, [trajectory])
    return queue.next_assignment(annotator, project, kind="step_label")


def label_url(project, trajectory, index):
    return reverse("step-label", args=[project.pk, trajectory.pk, index])


def steps_url(project, trajectory):
    return reverse("trajectory-steps", args=[project.pk, trajectory.pk])


def current_labels(user, trajectory):
    return dict(
        StepLabel.objects.filter(annotator=user, step__trajectory=trajectory, is_current=True).values_list(
            "step__index", "value"
        )
    )


# The page ----------------------------------------------------------------------------------------------------------


def test_label_next_shows_the_leased_trajectory_with_one_label_control_per_step(
    annotator_client, project, trajectory, assignment
):
    response = annotator_client.get(reverse("label-next", args=[project.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    for step in trajectory.steps.all():
        assert body.count(f'id="step-{step.pk}-label"') == 1
        assert f'action="{label_url(project, trajectory, step.index)}"' in body
    assert f'name="assignment" value="{assignment.pk}"' in body
    assert reverse("step-labels-finish", args=[project.pk, assignment.pk]) in body
    assert reverse("assignment-skip", args=[project.pk, assignment.pk]) in body
    assert 'data-key="Enter"' in body and 'data-row-key="f"' in body and 'data-row-key="+ 1"' in body


def test_a_reload_resumes_the_same_item(annotator_client, project, make_trajectory, trajectory, assignment):
    QueueItem.objects.enqueue_trajectories(project, [make_trajectory(2)])
    for _ in range(2):
        body = annotator_client.get(reverse("label-next", args=[project.pk])).content.decode()
        assert f'name="assignment" value="{assignment.pk}"' in body
        assert f"Label the steps of trajectory {trajectory.pk}" in body


def test_label_next_says_nothing_left_when_the_queue_is_empty(annotator_client, project):
    response = annotator_client.get(reverse("label-next", args=[project.pk]))
    assert response.status_code == 200
    assert "Nothing left to label" in response.content.decode()


def test_label_next_for_htmx_answers_with_the_workspace_fragment_only(annotator_client, project, assignment):
    body = annotator_client.get(reverse("label-next", args=[project.pk]), **HX).content.decode()
    assert body.lstrip().startswith('<div id="workspace"')
    assert "<html" not in body


def test_any_member_can_open_the_steps_page_of_a_trajectory_without_an_assignment(
    client, researcher, project, trajectory
):
    client.force_login(researcher)
    response = client.get(steps_url(project, trajectory))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'name="assignment"' not in body
    assert "Submit &amp; next" not in body


def test_an_annotator_sees_no_outcomes_rewards_oracle_or_blind_policy_names(
    client, annotator, researcher, project, task, external_policy
):
    trajectory = play_gridworld(task, external_policy, SEED_7_ACTIONS)
    assert trajectory.success is True
    client.force_login(annotator)
    body = client.get(steps_url(project, trajectory)).content.decode()
    assert "success" not in body and "failure" not in body
    assert "reward" not in body
    assert "oracle-secret" not in body and "step_correct" not in body
    assert external_policy.name not in body
    assert "I move right this turn" in body  # the steps themselves are shown

    client.force_login(researcher)
    body = client.get(steps_url(project, trajectory)).content.decode()
    assert "success" in body and "reward 1.0" in body and external_policy.name in body
    assert "oracle-secret" not in body


def test_an_outsider_gets_404_for_every_step_label_url(client, outsider, project, trajectory, assignment):
    client.force_login(outsider)
    assert client.get(reverse("label-next", args=[project.pk])).status_code == 404
    assert client.get(steps_url(project, trajectory)).status_code == 404
    posts = [
        (label_url(project, trajectory, 0), {"value": "1"}),
        (reverse("step-first-error", args=[project.pk, trajectory.pk, 1]), {}),
        (reverse("critique-add", args=[project.pk, trajectory.pk]), {"text": "x"}),
        (reverse("trajectory-rate", args=[project.pk, trajectory.pk]), {"score": "3"}),
        (reverse("step-labels-finish", args=[project.pk, assignment.pk]), {}),
    ]
    for url, data in posts:
        assert client.post(url, data, **HX).status_code == 404, url
    assert not StepLabel.objects.exists()


def test_anonymous_users_are_sent_to_log_in(client, project, trajectory):
    response = client.get(steps_url(project, trajectory))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_every_form_carries_a_csrf_token_and_a_post_without_one_is_refused(annotator, project, trajectory, assignment):
    client = Client(enforce_csrf_checks=True)
    client.force_login(annotator)
    body = client.get(reverse("label-next", args=[project.pk])).content.decode()
    forms = re.findall(r"<form\b", body)
    assert len(forms) >= trajectory.num_steps + 3
    assert body.count('name="csrfmiddlewaretoken"') == len(forms)
    response = client.post(label_url(project, trajectory, 0), {"value": "1"}, **HX)
    assert response.status_code == 403
    assert not StepLabel.objects.exists()


# One label per click -------------------------------------------------------------------------------------------------


def test_a_label_click_stores_the_label_and_answers_with_only_that_steps_control(
    annotator_client, annotator, project, trajectory, assignment
):
    step = trajectory.steps.get(index=1)
    response = annotator_client.post(
        label_url(project, trajectory, 1),
        {"value": "-1", "client_token": str(uuid.uuid4()), "assignment": assignment.pk},
        **HX,
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith(f'<form id="step-{step.pk}-label"')
    assert body.count("<form") == 1
    assert re.search(r'value="-1"[^>]*aria-pressed="true"', body)
    assert current_labels(annotator, trajectory) == {1: -1}
    label = StepLabel.objects.get()
    assert label.assignment_id == assignment.pk


def test_labelling_a_step_again_writes_a_new_revision(annotator_client, annotator, project, trajectory):
    for value in ("1", "0"):
        annotator_client.post(label_url(project, trajectory, 0), {"value": value, "client_token": str(uuid.uuid4())})
    assert current_labels(annotator, trajectory) == {0: 0}
    assert StepLabel.objects.filter(annotator=annotator).count() == 2


def test_a_double_submit_with_the_same_client_token_stores_one_label(annotator_client, project, trajectory):
    data = {"value": "1", "client_token": str(uuid.uuid4())}
    first = annotator_client.post(label_url(project, trajectory, 2), data, **HX)
    second = annotator_client.post(label_url(project, trajectory, 2), data, **HX)
    assert first.status_code == second.status_code == 200
    assert StepLabel.objects.count() == 1


@pytest.mark.parametrize("value", ["2", "-3", "abc", ""])
def test_an_invalid_step_value_gets_400_with_the_message_beside_the_control(
    annotator_client, project, trajectory, value
):
    step = trajectory.steps.get(index=0)
    response = annotator_client.post(label_url(project, trajectory, 0), {"value": value}, **HX)
    assert response.status_code == 400
    body = response.content.decode()
    assert f'id="step-{step.pk}-label"' in body
    assert re.search(r'class="field-error">[^<]*(\+1, 0 or -1|whole number)', body)
    assert not StepLabel.objects.exists()


def test_an_unknown_step_gets_404_with_a_message(annotator_client, project, trajectory):
    response = annotator_client.post(label_url(project, trajectory, 40), {"value": "1"}, **HX)
    assert response.status_code == 404
    assert not StepLabel.objects.exists()


def test_a_trajectory_of_another_project_cannot_be_labelled_through_mine(annotator_client, project, gridworld_spec):
    from feedback_app.models import Project, Step, Task, Trajectory

    other = Project.objects.create(name="Other", environment=gridworld_spec)
    foreign = Trajectory.objects.create(
        project=other, task=Task.objects.create(project=other, instruction="x"), source="human", num_steps=1
    )
    Step.objects.create(trajectory=foreign, index=0, action="up")
    response = annotator_client.post(label_url(project, foreign, 0), {"value": "1"}, **HX)
    assert response.status_code == 404
    assert not StepLabel.objects.exists()


def test_first_error_labels_earlier_steps_good_this_one_bad_and_swaps_every_control(
    annotator_client, annotator, project, trajectory
):
    response = annotator_client.post(
        reverse("step-first-error", args=[project.pk, trajectory.pk, 2]),
        {"client_token": str(uuid.uuid4())},
        **HX,
    )
    assert response.status_code == 200
    assert response["HX-Reswap"] == "none"
    body = response.content.decode()
    for step in trajectory.steps.all():
        assert re.search(rf'id="step-{step.pk}-label"[^>]*hx-swap-oob="true"', body, re.S)
    assert current_labels(annotator, trajectory) == {0: 1, 1: 1, 2: -1}


def test_first_error_without_htmx_redirects_back_to_the_page(annotator_client, project, trajectory):
    response = annotator_client.post(reverse("step-first-error", args=[project.pk, trajectory.pk, 0]))
    assert response.status_code == 303
    assert response["Location"] == steps_url(project, trajectory)


def test_an_annotator_never_sees_another_annotators_labels(client, annotator, other_annotator, project, trajectory):
    labelling.label_first_error(other_annotator, trajectory, 3)
    client.force_login(annotator)
    body = client.get(steps_url(project, trajectory)).content.decode()
    assert 'aria-pressed="true"' not in body


def test_an_annotator_cannot_label_with_another_annotators_assignment(
    client, project, other_annotator, trajectory, assignment
):
    client.force_login(other_annotator)
    response = client.post(label_url(project, trajectory, 0), {"value": "1", "assignment": assignment.pk}, **HX)
    assert response.status_code == 404
    response = client.post(reverse("step-labels-finish", args=[project.pk, assignment.pk]), **HX)
    assert response.status_code == 404
    assert not StepLabel.objects.exists()


# Submit & next -----------------------------------------------------------------------------------------------------


def test_submit_with_unlabelled_steps_is_refused_and_marks_them_beside_the_steps(
    annotator_client, annotator, project, trajectory, assignment
):
    labelling.label_step(annotator, trajectory, 1, 1)
    response = annotator_client.post(reverse("step-labels-finish", args=[project.pk, assignment.pk]), **HX)
    assert response.status_code == 400
    body = response.content.decode()
    assert "Label steps 1, 3, 4 first" in body
    steps = {step.index: step for step in trajectory.steps.all()}
    for index in (0, 2, 3):
        assert re.search(rf'id="step-{steps[index].pk}-label" class="step-label needs-label"[^>]*hx-swap-oob', body)
    assert f'id="step-{steps[1].pk}-label"' not in body
    assignment.refresh_from_db()
    assert assignment.status == AssignmentStatus.LEASED


def test_submit_and_next_finishes_the_assignment_and_answers_with_the_next_item(
    annotator_client, annotator, project, make_trajectory, trajectory, assignment
):
    following = make_trajectory(2)
    QueueItem.objects.enqueue_trajectories(project, [following])
    labelling.label_first_error(annotator, trajectory, 1)
    response = annotator_client.post(reverse("step-labels-finish", args=[project.pk, assignment.pk]), **HX)
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#workspace"
    body = response.content.decode()
    assert f"trajectory {following.pk}" in body
    assignment.refresh_from_db()
    assert assignment.status == AssignmentStatus.DONE


def test_submit_without_htmx_redirects_to_the_next_item(annotator_client, annotator, project, trajectory, assignment):
    labelling.label_first_error(annotator, trajectory, 0)
    response = annotator_client.post(reverse("step-labels-finish", args=[project.pk, assignment.pk]))
    assert response.status_code == 303
    assert response["Location"] == reverse("label-next", args=[project.pk])
    assert "Nothing left to label" in annotator_client.get(response["Location"]).content.decode()


def test_skip_gives_the_item_back_and_moves_on(annotator_client, project, trajectory, assignment):
    response = annotator_client.post(
        reverse("assignment-skip", args=[project.pk, assignment.pk]), {"reason": "unclear"}, follow=True, **HX
    )
    assert response.status_code == 200
    assert "Nothing left to label" in response.content.decode()
    assignment.refresh_from_db()
    assert (assignment.status, assignment.skip_reason) == (AssignmentStatus.SKIPPED, "unclear")


# Cost --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url_name", ["label-next", "trajectory-steps"])
def test_the_page_makes_the_same_number_of_queries_for_3_and_12_steps(
    client, annotator, project, make_trajectory, django_assert_max_num_queries, url_name
):
    # No gold draw: a request that draws "gold first" looks for a gold item before the rest (one query more),
    # whatever the trajectory's length, and the draw is random.
    project.gold_fraction = 0.0
    project.save(update_fields=["gold_fraction"])
    client.force_login(annotator)
    counts = []
    for n_steps in (3, 12):
        trajectory = make_trajectory(n_steps)
        labelling.label_first_error(annotator, trajectory, n_steps - 1)
        labelling.add_critique(annotator, trajectory, text="meh", step_index=1)
        labelling.rate(annotator, trajectory, score=3)
        if url_name == "label-next":
            QueueItem.objects.enqueue_trajectories(project, [trajectory], priority=n_steps)
            url = reverse("label-next", args=[project.pk])
        else:
            url = steps_url(project, trajectory)
        with django_assert_max_num_queries(20) as captured:
            response = client.get(url)
        assert f"trajectory {trajectory.pk}" in response.content.decode()
        counts.append(len(captured.captured_queries))
        if url_name == "label-next":
            queue.skip(queue.current_assignment(project, annotator))
    assert counts[0] == counts[1]
