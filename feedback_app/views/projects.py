from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from feedback_app.access import get_project_for_member, sees_outcomes
from feedback_app.models import Membership, PolicyVersion, TrainingRun, Trajectory


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    memberships = (
        Membership.objects.filter(user=request.user)
        .select_related("project", "project__environment")
        .annotate(trajectory_count=Count("project__trajectories", distinct=True))
        .order_by("project__name")
    )
    return render(request, "feedback_app/home.html", {"memberships": memberships})


@require_GET
@login_required
def project_detail(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, membership = get_project_for_member(request, project_pk)
    show_outcomes = sees_outcomes(membership)
    policies = PolicyVersion.objects.filter(project=project).annotate(
        trajectory_count=Count("trajectories"),
        success_count=Count("trajectories", filter=Q(trajectories__success=True)),
    )
    trajectories = (
        Trajectory.objects.filter(project=project)
        .select_related("task", "policy_version")
        .order_by("-created_at", "-id")[:50]
    )
    runs = TrainingRun.objects.filter(project=project).order_by("-created_at")[:10] if show_outcomes else []
    context = {
        "project": project,
        "membership": membership,
        "show_outcomes": show_outcomes,
        "show_policy_names": show_outcomes or not project.blind,
        "policies": policies,
        "trajectories": trajectories,
        "trajectory_total": Trajectory.objects.filter(project=project).count(),
        "runs": runs,
    }
    return render(request, "feedback_app/project_detail.html", context)
