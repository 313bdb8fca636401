"""The project's query strategy through the API: researchers and admins choose it, nobody else, and a bad value is
named."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def _url(project) -> str:
    return f"/api/projects/{project.pk}/"


def test_a_new_project_queries_random_pairs(project, annotator, api_as):
    assert api_as(annotator).get(_url(project)).json()["query_strategy"] == "random"


@pytest.mark.parametrize("who", ["researcher", "admin_member"])
def test_researchers_and_admins_change_the_query_strategy(project, who, request, api_as):
    response = api_as(request.getfixturevalue(who)).patch(_url(project), {"query_strategy": "disagreement"})

    assert response.status_code == 200, response.content
    assert response.json()["query_strategy"] == "disagreement"
    project.refresh_from_db()
    assert project.query_strategy == "disagreement"


def test_a_researcher_may_not_change_other_settings_along_with_it(project, researcher, api_as):
    response = api_as(researcher).patch(_url(project), {"query_strategy": "uncertainty", "overlap": 5})

    assert response.status_code == 403
    project.refresh_from_db()
    assert (project.query_strategy, project.overlap) == ("random", 2)


def test_an_annotator_may_not_change_the_query_strategy_and_an_outsider_cannot_see_the_project(
    project, annotator, outsider, api_as
):
    assert api_as(annotator).patch(_url(project), {"query_strategy": "uncertainty"}).status_code == 403
    assert api_as(outsider).patch(_url(project), {"query_strategy": "uncertainty"}).status_code == 404
    project.refresh_from_db()
    assert project.query_strategy == "random"


def test_an_unknown_query_strategy_is_refused_naming_the_field_and_the_choices(project, researcher, api_as):
    response = api_as(researcher).patch(_url(project), {"query_strategy": "loudest"})

    assert response.status_code == 400
    (message,) = response.json()["query_strategy"]
    assert '"loudest" is not a query strategy' in message and "new_vs_parent" in message
    project.refresh_from_db()
    assert project.query_strategy == "random"
