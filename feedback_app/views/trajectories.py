from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from feedback_app.access import get_trajectory_for_member, sees_outcomes
from feedback_app.templatetags.tandem import mark_repeated_observations


@require_GET
@login_required
def trajectory_detail(request: HttpRequest, project_pk: int, trajectory_pk: int) -> HttpResponse:
    trajectory, membership = get_trajectory_for_member(request, project_pk, trajectory_pk)
    show_outcomes = sees_outcomes(membership)
    context = {
        "project": membership.project,
        "trajectory": trajectory,
        "steps": mark_repeated_observations(trajectory.steps.order_by("index")),
        "show_outcomes": show_outcomes,
        "show_policy_names": show_outcomes or not membership.project.blind,
    }
    return render(request, "feedback_app/trajectory_detail.html", context)
