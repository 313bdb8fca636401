"""The label-quality panel is for researchers: annotators get 403, outsiders 404; htmx gets the fragment only."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback_app.models import Comparison

pytestmark = pytest.mark.django_db


def _url(project, **query):
    url = reverse("project-quality", args=[project.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


@pytest.fixture
def labelled(project, annotator, other_annotator, make_trajectory):
    for index in range(5):
        a, b = make_trajectory(), make_trajectory()
        for user, choice in ((annotator, "a"), (other_annotator, "a" if index < 4 else "b")):
            Comparison.objects.create(
                project=project, annotator=user, trajectory_a=a, trajectory_b=b, choice=choice, seconds_spent=12.0
            )


def test_an_outsider_gets_404(client, outsider, project):
    client.force_login(outsider)
    assert client.get(_url(project)).status_code == 404


def test_an_annotator_gets_403(client, annotator, project):
    client.force_login(annotator)
    assert client.get(_url(project)).status_code == 403
    assert client.get(_url(project), headers={"HX-Request": "true"}).status_code == 403


def test_anonymous_users_are_sent_to_log_in(client, project):
    response = client.get(_url(project))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_a_researcher_sees_the_full_page_with_the_figures(client, researcher, project, labelled):
    client.force_login(researcher)
    response = client.get(_url(project))
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" in body and 'id="project-quality"' in body
    assert "annotator2" in body and "4 / 5 (0.80)" in body  # agreement with the majority (the other annotator)
    assert "12.0" in body  # median seconds
    # Cohen's kappa for a a a a a vs a a a a b: p_o = 0.8, p_e = 0.8, kappa = 0.
    assert "<td>annotator · annotator2</td><td>5</td><td>0.000</td>" in body
    assert response["Vary"] and "HX-Request" in response["Vary"]


def test_htmx_gets_only_the_fragment(client, researcher, project, labelled):
    client.force_login(researcher)
    response = client.get(_url(project), headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body and body.strip().startswith('<section id="project-quality">')


def test_a_bad_threshold_is_refused_with_the_field_named(client, researcher, project):
    client.force_login(researcher)
    response = client.get(_url(project, min_shared="many"))
    assert response.status_code == 400 and b"min_shared" in response.content
    assert "No pair of annotators shares 2 items" in client.get(_url(project, min_shared=2)).content.decode()


def test_the_project_page_loads_the_panel_for_researchers_only(client, researcher, annotator, project):
    url = _url(project)
    client.force_login(researcher)
    body = client.get(reverse("project-detail", args=[project.pk])).content.decode()
    assert f'hx-get="{url}"' in body and 'hx-trigger="load"' in body and f'href="{url}"' in body
    client.force_login(annotator)
    body = client.get(reverse("project-detail", args=[project.pk])).content.decode()
    assert url not in body


def test_the_panel_makes_a_constant_number_of_queries(
    client, researcher, project, annotator, other_annotator, make_trajectory, labelled, django_assert_max_num_queries
):
    client.force_login(researcher)
    with django_assert_max_num_queries(12) as few:
        client.get(_url(project), headers={"HX-Request": "true"})
    for _ in range(20):
        a, b = make_trajectory(n_steps=2), make_trajectory(n_steps=2)
        for user in (annotator, other_annotator):
            Comparison.objects.create(project=project, annotator=user, trajectory_a=a, trajectory_b=b, choice="b")
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = client.get(_url(project), headers={"HX-Request": "true"})
    assert "50 labels on 25 items" in response.content.decode()
