"""The trajectory rating on the step-label page: a 1–5 score and a thumb, each click stored at once."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from feedback_app import labelling
from feedback_app.models import Rating
from tests.feedback_app.views.conftest import assert_refused

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def rate(client, project, trajectory, **data):
    data.setdefault("client_token", str(uuid.uuid4()))
    return client.post(reverse("trajectory-rate", args=[project.pk, trajectory.pk]), data, **HX)


def current(user, trajectory):
    return Rating.objects.get(annotator=user, trajectory=trajectory, is_current=True)


def test_a_saved_score_and_thumb_are_one_revision_and_the_answer_is_the_rating_control(
    annotator_client, annotator, project, trajectory
):
    response = rate(annotator_client, project, trajectory, score="4", thumb="up")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<form id="rating"')
    assert re.search(r'name="score" value="4" checked', body) and re.search(r'name="thumb" value="up" checked', body)
    rating = Rating.objects.get(annotator=annotator, trajectory=trajectory)
    assert (rating.score, rating.thumb_up, rating.revision) == (4, True, 1)


def test_a_thumb_keeps_the_score_and_a_new_score_keeps_the_thumb(annotator_client, annotator, project, trajectory):
    rate(annotator_client, project, trajectory, score="2")
    rate(annotator_client, project, trajectory, thumb="down")
    assert (current(annotator, trajectory).score, current(annotator, trajectory).thumb_up) == (2, False)
    rate(annotator_client, project, trajectory, score="5")
    rating = current(annotator, trajectory)
    assert (rating.score, rating.thumb_up, rating.revision) == (5, False, 3)


@pytest.mark.parametrize(
    ("data", "message"),
    [({"score": "9"}, "from 1 to 5"), ({"score": "x"}, "whole number"), ({"thumb": "sideways"}, "up or down")],
)
def test_a_bad_rating_gets_400_with_the_message_beside_it(annotator_client, project, trajectory, data, message):
    assert_refused(rate(annotator_client, project, trajectory, **data), message)
    assert not Rating.objects.exists()


def test_an_empty_rating_is_refused(annotator_client, project, trajectory):
    assert rate(annotator_client, project, trajectory).status_code == 400
    assert not Rating.objects.exists()


def test_a_double_submit_stores_one_rating(annotator_client, project, trajectory):
    token = str(uuid.uuid4())
    rate(annotator_client, project, trajectory, score="3", client_token=token)
    rate(annotator_client, project, trajectory, score="3", client_token=token)
    assert Rating.objects.count() == 1


def test_an_annotator_never_sees_another_annotators_rating(client, annotator, other_annotator, project, trajectory):
    labelling.rate(other_annotator, trajectory, score=5, thumb_up=True)
    client.force_login(annotator)
    page = client.get(reverse("trajectory-steps", args=[project.pk, trajectory.pk])).content.decode()
    rating_form = page[page.index('<form id="rating"') :]
    rating_form = rating_form[: rating_form.index("</form>")]
    assert " checked" not in rating_form and "saved" not in rating_form


def test_a_researcher_may_rate_and_an_outsider_gets_404(client, researcher, outsider, project, trajectory):
    client.force_login(researcher)
    assert rate(client, project, trajectory, score="1").status_code == 200
    client.force_login(outsider)
    assert rate(client, project, trajectory, score="5").status_code == 404
    assert list(Rating.objects.values_list("score", flat=True)) == [1]


def test_a_project_without_ratings_shows_no_rating_control(annotator_client, project, trajectory):
    project.feedback_kinds = ["step_label"]
    project.save()
    page = annotator_client.get(reverse("trajectory-steps", args=[project.pk, trajectory.pk])).content.decode()
    assert 'id="rating"' not in page
    assert rate(annotator_client, project, trajectory, score="3").status_code == 400
