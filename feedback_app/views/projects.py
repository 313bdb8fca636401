from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import CharField, Count, Q, Value
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from feedback_app import queue
from feedback_app.access import get_project_for_member, sees_outcomes
from feedback_app.models import LabelKind, Membership, PolicyVersion, TrainingRun, Trajectory
from feedback_app.views.history import LABEL_MODELS
from feedback_app.views.workspace import next_item_url


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """My projects, each with my queue (items left per kind, linked to the page that serves them), my labels of
    today and the guidelines. Three queries (and the session's) however many projects."""
    memberships = list(
        Membership.objects.filter(user=request.user)
        .select_related("project", "project__environment")
        .annotate(trajectory_count=Count("project__trajectories", distinct=True))
        .order_by("project__name")
    )
    queues = _queue_counts(memberships, request.user)
    today = _labels_today(request.user)
    for membership in memberships:
        pk = membership.project.pk
        membership.queue = [
            {"kind": LabelKind(kind).label, "count": n, "url": next_item_url(pk, kind)}
            for kind, n in sorted(queues.get(pk, {}).items())
        ]
        membership.labels_today = [
            {"kind": LabelKind(kind).label, "count": n} for kind, n in sorted(today.get(pk, {}).items())
        ]
    return render(request, "feedback_app/home.html", {"memberships": memberships})


def _queue_counts(memberships: list[Membership], user) -> dict[int, dict[str, int]]:
    """queue.queue_counts for every project at once: the same per-project query, joined by UNION ALL."""
    now = timezone.now()
    parts = [
        queue.open_items(m.project, user, now=now).order_by().values("project_id", "kind").annotate(n=Count("pk"))
        for m in memberships
    ]
    if not parts:
        return {}
    counts: dict[int, dict[str, int]] = {}
    for row in parts[0].union(*parts[1:], all=True):
        counts.setdefault(row["project_id"], {})[row["kind"]] = row["n"]
    return counts


def _labels_today(user) -> dict[int, dict[str, int]]:
    """How many labels of each kind the user created today (local time), current or not, per project."""
    start = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    parts = [
        model.objects.filter(annotator=user, created_at__gte=start)
        .order_by()
        .values("project_id")
        .annotate(kind=Value(kind, output_field=CharField()), n=Count("pk"))
        for kind, model in LABEL_MODELS.items()
    ]
    counts: dict[int, dict[str, int]] = {}
    for row in parts[0].union(*parts[1:], all=True):
        counts.setdefault(row["project_id"], {})[row["kind"]] = row["n"]
    return counts


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
