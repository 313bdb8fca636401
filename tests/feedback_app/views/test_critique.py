"""Critiques from the step-label page: of the whole trajectory, of a step, or of a character span of a step's field;
errors are shown beside their field and the form keeps what was typed."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from feedback_app import labelling
from feedback_app.models import Critique
from tests.feedback_app.views.conftest import assert_refused

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def critique_url(project, trajectory):
    return reverse("critique-add", args=[project.pk, trajectory.pk])


def post(client, project, trajectory, **data):
    data.setdefault("client_token", str(uuid.uuid4()))
    return client.post(critique_url(project, trajectory), data, **HX)


def test_a_critique_of_the_whole_trajectory_is_stored_with_its_tags(annotator_client, annotator, project, trajectory):
    response = post(
        annotator_client,
        project,
        trajectory,
        text="  Wanders around before heading for the goal. ",
        tags=["loops", "wrong direction"],
        more_tags="slow, , detour",
    )
    assert response.status_code == 200
    critique = Critique.objects.get()
    assert (critique.annotator, critique.trajectory, critique.step) == (annotator, trajectory, None)
    assert critique.text == "Wanders around before heading for the goal."
    assert critique.tags == ["loops", "wrong direction", "slow", "detour"]
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="critique-panel"')
    assert f'id="critique-{critique.pk}"' in body and "whole trajectory" in body
    assert '<textarea name="text" id="critique-text" rows="3"></textarea>' in body  # a fresh form


def test_a_critique_of_one_step(annotator_client, project, trajectory):
    response = post(annotator_client, project, trajectory, text="Bumps the wall.", step_index="1")
    assert response.status_code == 200
    critique = Critique.objects.get()
    assert critique.step.index == 1 and critique.span_field == "" and critique.span_start is None


def test_a_span_critique_stores_offsets_into_the_stored_text(annotator_client, project, trajectory):
    step = trajectory.steps.get(index=2)  # reasoning "think 2"
    response = post(
        annotator_client,
        project,
        trajectory,
        text="Not thinking much.",
        step_index="2",
        span_field="reasoning",
        span_start="0",
        span_end="5",
    )
    assert response.status_code == 200
    critique = Critique.objects.get()
    assert (critique.step, critique.span_field, critique.span_start, critique.span_end) == (step, "reasoning", 0, 5)
    assert step.reasoning[critique.span_start : critique.span_end] == "think"
    assert re.search(r"reasoning 0–5 <q[^>]*>think</q>", response.content.decode())


def test_a_span_out_of_range_gets_400_beside_the_span_and_the_form_keeps_the_text(
    annotator_client, project, trajectory
):
    response = post(
        annotator_client,
        project,
        trajectory,
        text="Too far",
        step_index="0",
        span_field="reasoning",
        span_start="3",
        span_end="99",
        tags=["loops"],
        more_tags="mine",
    )
    body = assert_refused(response, "lies outside the 7 characters")
    assert ">Too far</textarea>" in body
    assert re.search(r'value="loops" checked', body) and 'value="mine"' in body
    assert re.search(r'<option value="0" selected>', body)
    assert 'id="critique-span-start" value="3"' in body
    assert not Critique.objects.exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"text": "   "}, "Write the critique."),
        ({"text": "x", "span_field": "reasoning", "span_start": "0", "span_end": "2"}, "A span needs the step"),
        ({"text": "x", "step_index": "0", "span_field": "reasoning", "span_start": "a", "span_end": "2"}, "whole"),
        ({"text": "x", "step_index": "0", "span_field": "elbow", "span_start": "0", "span_end": "2"}, "elbow"),
        ({"text": "x", "step_index": "0", "span_field": "reasoning", "span_start": "4", "span_end": "2"}, "outside"),
        ({"text": "x", "step_index": "9"}, "has no step 10"),
    ],
)
def test_bad_critiques_get_400_with_the_message_beside_the_field(annotator_client, project, trajectory, data, message):
    assert_refused(post(annotator_client, project, trajectory, **data), message)
    assert not Critique.objects.exists()


def test_a_double_submit_stores_one_critique(annotator_client, project, trajectory):
    token = str(uuid.uuid4())
    for _ in range(2):
        assert post(annotator_client, project, trajectory, text="once", client_token=token).status_code == 200
    assert Critique.objects.count() == 1


def test_a_project_without_critiques_refuses_them_with_a_message(annotator_client, project, trajectory):
    project.feedback_kinds = ["step_label", "rating"]
    project.save()
    assert_refused(post(annotator_client, project, trajectory, text="x"), "does not collect critiques")
    page = annotator_client.get(reverse("trajectory-steps", args=[project.pk, trajectory.pk])).content.decode()
    assert 'id="critique-form"' not in page


def test_an_annotator_sees_only_their_own_critiques(client, annotator, other_annotator, project, trajectory):
    labelling.add_critique(other_annotator, trajectory, text="someone else's opinion")
    labelling.add_critique(annotator, trajectory, text="my own opinion", step_index=0)
    client.force_login(annotator)
    page = client.get(reverse("trajectory-steps", args=[project.pk, trajectory.pk])).content.decode()
    assert "my own opinion" in page and "someone else" not in page


def test_a_researcher_may_critique_and_an_outsider_may_not(client, researcher, outsider, project, trajectory):
    client.force_login(researcher)
    assert post(client, project, trajectory, text="fine").status_code == 200
    client.force_login(outsider)
    assert post(client, project, trajectory, text="sneaky").status_code == 404
    assert list(Critique.objects.values_list("text", flat=True)) == ["fine"]


def test_without_htmx_a_critique_redirects_back_to_the_page(annotator_client, project, trajectory):
    response = annotator_client.post(critique_url(project, trajectory), {"text": "plain form"})
    assert response.status_code == 303
    assert response["Location"] == reverse("trajectory-steps", args=[project.pk, trajectory.pk])
    assert Critique.objects.get().text == "plain form"
