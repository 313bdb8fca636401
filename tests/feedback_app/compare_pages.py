"""What the compare page's tests share: its addresses, opening it, posting a label and reading which trajectory
it shows on which side."""

from __future__ import annotations

import re

from django.urls import reverse

from feedback_app import labelling
from feedback_app.models import Assignment, Step

HTMX = {"HTTP_HX_REQUEST": "true"}


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
