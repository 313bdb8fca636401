"""The admin: a trajectory's change page stays light however many steps it has."""

from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_a_long_trajectorys_change_page_links_to_its_steps_instead_of_inlining_them(
    admin_client, make_trajectory, django_assert_max_num_queries
):
    trajectory = make_trajectory(n_steps=10_000)
    with django_assert_max_num_queries(25):
        response = admin_client.get(reverse("admin:feedback_app_trajectory_change", args=[trajectory.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "obs 9999" not in page and "think 0" not in page
    listing = reverse("admin:feedback_app_step_changelist") + f"?trajectory__id__exact={trajectory.pk}"
    assert "10000 steps" in page and f'href="{listing}"' in page.replace("&amp;", "&")
    assert f'href="{reverse("trajectory-detail", args=[trajectory.project_id, trajectory.pk])}"' in page


def test_a_trajectorys_steps_are_listed_a_page_at_a_time(admin_client, make_trajectory):
    trajectory, other = make_trajectory(n_steps=250), make_trajectory(n_steps=3)
    listing = reverse("admin:feedback_app_step_changelist")
    response = admin_client.get(listing, {"trajectory__id__exact": trajectory.pk})
    assert response.status_code == 200
    rows = response.context["cl"].result_list
    assert len(rows) == 100 and {step.trajectory_id for step in rows} == {trajectory.pk}
    assert [step.index for step in rows] == list(range(100))
    assert response.context["cl"].result_count == 250
    assert other.pk not in {step.trajectory_id for step in rows}
