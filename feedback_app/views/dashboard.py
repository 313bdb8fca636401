"""The researcher's dashboard: the project overview, the model registry with its lineage graph, and the leaderboard.

All three are for researchers and admins. Annotators get 403: the overview ranks annotators against each other
(throughput, agreement, gold accuracy), and the registry and leaderboard name policy versions and their outcomes,
which a blind project hides from annotators (`access.sees_outcomes`). Outsiders get 404, as everywhere.

Every figure is counted in the database: the queries a page makes depend on the number of policy versions, runs
and models in the registry, never on the number of labels or trajectories.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import CharField, Count, F, Q, Sum, Value
from django.db.models.functions import TruncDate
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from feedback_app.access import MANAGER_ROLES, get_project_for_role
from feedback_app.agreement import project_quality
from feedback_app.annotator_time import AnnotatorTime
from feedback_app.charts import bar_chart, interval_chart
from feedback_app.leaderboard import DEFAULT_PRIOR, fit_bradley_terry, outcomes_from_choices
from feedback_app.lineage import Node, lineage_svg
from feedback_app.models import (
    Assignment,
    DatasetSnapshot,
    Evaluation,
    LabelKind,
    PolicyVersion,
    Project,
    RegisteredModel,
    RunKind,
    RunStatus,
    TrainingRun,
    Trajectory,
)
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.queue import AssignmentStatus, QueueItem
from feedback_app.models.trajectories import TrajectorySource
from feedback_app.views.history import LABEL_MODELS
from feedback_app.win_rates import human_win_rates, version_comparison_counts

LABEL_DAYS = 30
THROUGHPUT_DAYS = 7
# Runs that make no model (rollouts, evaluations) are not part of the lineage.
LINEAGE_RUN_EXCLUDED = (RunKind.ROLLOUT, RunKind.EVALUATION)
MAX_LINEAGE_RUNS = 150


# --- Overview -----------------------------------------------------------------------------------------------------


@require_GET
@login_required
def overview(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    today = timezone.localdate()
    days = [today - timedelta(days=n) for n in range(LABEL_DAYS - 1, -1, -1)]
    label_rows = _label_counts(project, since=days[0])
    per_kind: dict[str, dict[date, int]] = defaultdict(lambda: defaultdict(int))
    for row in label_rows:
        per_kind[row["kind"]][row["day"]] += row["n"]
    kinds = [kind for kind in LabelKind.values if kind in per_kind]
    labels_chart = bar_chart(
        [day.strftime("%m-%d") for day in days],
        {LabelKind(kind).label: [per_kind[kind][day] for day in days] for kind in kinds},
        title=f"Labels per day, last {LABEL_DAYS} days",
        y_label="labels",
    )
    context = {
        "project": project,
        "labels_chart": labels_chart,
        "labels_total": sum(row["n"] for row in label_rows),
        "queue": _queue_depth(project),
        "query_strategies": QueryStrategy.choices,
        **_annotators(project, label_rows, days[-THROUGHPUT_DAYS:]),
        **_trajectories_per_policy(project),
        **_time_per_label(project),
    }
    return render(request, "feedback_app/dashboard/overview.html", context)


@require_POST
@login_required
def set_query_strategy(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The project's query strategy: which pairs rollout runs queue for comparison (`training.selection`)."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    value = request.POST.get("query_strategy", "")
    if value not in QueryStrategy.values:
        choices = ", ".join(QueryStrategy.values)
        return HttpResponse(f"query_strategy: {value!r} is not a query strategy; choose one of {choices}", status=400)
    project.query_strategy = value
    project.save(update_fields=["query_strategy"])
    messages.success(request, f"Comparisons are now chosen by {QueryStrategy(value).label.lower()}.")
    return redirect("project-dashboard", project.pk)


def _label_counts(project: Project, *, since: date) -> list[dict[str, Any]]:
    """Label rows created per day, kind and annotator since `since` (revisions included: each is work done), with
    the seconds spent on them. One query: one grouped count per kind of label, joined by UNION ALL."""
    start = timezone.make_aware(datetime.combine(since, time.min))
    parts = [
        model.objects.filter(project=project, created_at__gte=start)
        .order_by()
        .annotate(day=TruncDate("created_at"))
        .values("day", "annotator_id", "annotator__username")
        .annotate(
            kind=Value(kind, output_field=CharField()),
            n=Count("pk"),
            seconds=Sum("seconds_spent"),
            timed=Count("seconds_spent"),
        )
        for kind, model in LABEL_MODELS.items()
    ]
    return list(parts[0].union(*parts[1:], all=True))


# The users `manage.py simulate_annotators` labels as: their recorded time is the annotator-time model's, not a
# person's.
SIMULATED_PREFIX = "sim-"


def _time_per_label(project: Project) -> dict[str, Any]:
    """The median seconds people recorded on each kind of current label, beside the annotator-time model's default,
    and the ``kind=seconds,...`` value that gives the simulated annotators these medians instead. One query counts
    every kind's timed labels, then one per kind that has any reads its middle value or two, in order: at most six,
    whatever the number of labels."""
    timed = {
        kind: model.objects.filter(project=project, is_current=True, seconds_spent__isnull=False)
        .exclude(annotator__username__startswith=SIMULATED_PREFIX)
        .order_by()
        for kind, model in LABEL_MODELS.items()
    }
    parts = [
        labels.values(kind=Value(kind, output_field=CharField())).annotate(n=Count("pk"))
        for kind, labels in timed.items()
    ]
    counts = {row["kind"]: row["n"] for row in parts[0].union(*parts[1:], all=True)}
    defaults = AnnotatorTime()
    rows, measured = [], {}
    for kind, labels in timed.items():
        count = counts.get(kind, 0)
        median = None
        if count:
            ordered = labels.order_by("seconds_spent").values_list("seconds_spent", flat=True)
            middle = list(ordered[(count - 1) // 2 : count // 2 + 1])
            median = measured[kind] = sum(middle) / len(middle)
        default = getattr(defaults, kind)
        rows.append({"kind": LabelKind(kind).label, "timed": count, "median": median, "default": default})
    argument = ",".join(f"{kind}={round(seconds, 1):g}" for kind, seconds in measured.items())
    return {"label_time": rows, "label_time_argument": argument}


def _queue_depth(project: Project) -> list[dict[str, Any]]:
    """Per kind: open items (fewer labels than their overlap), labels they still need, and leases out now."""
    open_items = (
        QueueItem.objects.filter(project=project, completed_count__lt=F("overlap"))
        .order_by()
        .values("kind")
        .annotate(items=Count("pk"), labels_needed=Sum(F("overlap") - F("completed_count")))
    )
    leased = dict(
        Assignment.objects.filter(
            item__project=project, status=AssignmentStatus.LEASED, leased_until__gt=timezone.now()
        )
        .order_by()
        .values("item__kind")
        .annotate(n=Count("pk"))
        .values_list("item__kind", "n")
    )
    depth = {row["kind"]: row for row in open_items}
    return [
        {
            "kind": LabelKind(kind).label,
            "items": depth.get(kind, {}).get("items", 0),
            "labels_needed": depth.get(kind, {}).get("labels_needed", 0),
            "leased": leased.get(kind, 0),
        }
        for kind in LabelKind.values
        if kind in depth or kind in leased
    ]


def _annotators(project: Project, label_rows: list[dict[str, Any]], days: list[date]) -> dict[str, Any]:
    """Throughput over `days` beside agreement and gold accuracy (`agreement.project_quality`, as on the quality
    page), one row per annotator; and a chart of labels per annotator per day."""
    quality = project_quality(project)
    names: dict[int, str] = {a.annotator_id: a.username for a in quality.annotators}
    per_day: dict[int, dict[date, int]] = defaultdict(lambda: defaultdict(int))
    seconds: dict[int, float] = defaultdict(float)
    timed: dict[int, int] = defaultdict(int)
    for row in label_rows:
        if row["day"] < days[0]:
            continue
        annotator = row["annotator_id"]
        names[annotator] = row["annotator__username"]
        per_day[annotator][row["day"]] += row["n"]
        seconds[annotator] += row["seconds"] or 0.0
        timed[annotator] += row["timed"]
    majority = {kind.kind: {a.annotator_id: a.majority for a in kind.annotators} for kind in quality.kinds}
    gold = {a.annotator_id: a.gold for a in quality.annotators}
    rows = []
    for annotator in sorted(names, key=names.get):
        recent = sum(per_day[annotator].values())
        rows.append(
            {
                "username": names[annotator],
                "labels": recent,
                "per_day": recent / len(days),
                # Labels per hour of time spent labelling, from the labels that recorded their time.
                "per_hour": timed[annotator] / (seconds[annotator] / 3600) if seconds[annotator] else None,
                "comparison_agreement": majority[LabelKind.COMPARISON].get(annotator),
                "step_agreement": majority[LabelKind.STEP_LABEL].get(annotator),
                "gold": gold.get(annotator),
            }
        )
    active = [a for a in sorted(names, key=names.get) if per_day[a]]
    chart = bar_chart(
        [day.strftime("%m-%d") for day in days],
        {names[a]: [per_day[a][day] for day in days] for a in active},
        title=f"Labels per annotator per day, last {len(days)} days",
        y_label="labels",
    )
    return {"annotators": rows, "throughput_chart": chart, "quality": quality, "throughput_days": len(days)}


def _trajectories_per_policy(project: Project) -> dict[str, Any]:
    """Trajectories per policy version (and per source for those no policy made), with their outcomes."""
    rows = list(
        Trajectory.objects.filter(project=project)
        .order_by()
        .values("policy_version_id", "policy_version__name", "source")
        .annotate(
            n=Count("pk"),
            successes=Count("pk", filter=Q(success=True)),
            failures=Count("pk", filter=Q(success=False)),
        )
        .order_by("policy_version_id", "source")
    )
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["policy_version_id"] is None:
            name = f"({TrajectorySource(row['source']).label.lower()})"
        else:
            name = row["policy_version__name"]
        entry = merged.setdefault(name, {"name": name, "n": 0, "successes": 0, "failures": 0})
        for key in ("n", "successes", "failures"):
            entry[key] += row[key]
    policies = list(merged.values())
    for entry in policies:
        judged = entry["successes"] + entry["failures"]
        entry["success_rate"] = entry["successes"] / judged if judged else None
    chart = bar_chart(
        [p["name"] for p in policies],
        {
            "success": [p["successes"] for p in policies],
            "failure": [p["failures"] for p in policies],
            "no outcome": [p["n"] - p["successes"] - p["failures"] for p in policies],
        },
        title="Trajectories per policy version",
        y_label="trajectories",
    )
    return {"policies": policies, "policies_chart": chart}


# --- Models: the registry and its lineage ---------------------------------------------------------------------------


@require_GET
@login_required
def models_page(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    policies = list(
        PolicyVersion.objects.filter(project=project)
        .select_related("parent", "produced_by")
        .annotate(trajectory_count=Count("trajectories"))
        .order_by("created_at", "id")
    )
    judge_models = list(
        RegisteredModel.objects.filter(project=project)
        .select_related("run", "snapshot", "base_policy")
        .prefetch_related("inputs")
        .order_by("created_at", "id")
    )
    snapshots = list(DatasetSnapshot.objects.filter(project=project).order_by("created_at", "id"))
    runs = list(
        TrainingRun.objects.filter(project=project)
        .exclude(kind__in=LINEAGE_RUN_EXCLUDED)
        .only("id", "kind", "status", "snapshot_id", "base_policy_id", "inputs", "created_at")
        .order_by("-created_at", "-id")[:MAX_LINEAGE_RUNS]
    )[::-1]
    nodes, edges = _lineage(project, policies, judge_models, snapshots, runs)
    context = {
        "project": project,
        "policies": policies,
        "judge_models": judge_models,
        "snapshots": snapshots,
        "graph": lineage_svg(nodes, edges),
        "runs_truncated": len(runs) == MAX_LINEAGE_RUNS,
        "max_runs": MAX_LINEAGE_RUNS,
    }
    return render(request, "feedback_app/dashboard/models.html", context)


def _lineage(project, policies, judge_models, snapshots, runs) -> tuple[list[Node], list[tuple[str, str]]]:
    def run_url(run_id: int | None) -> str:
        return reverse("training-run", args=[project.pk, run_id]) if run_id else ""

    run_ids = {run.pk for run in runs}
    nodes = [Node(f"snapshot-{s.pk}", "snapshot", s.name, f"{s.export_kind} · {s.row_count} rows") for s in snapshots]
    edges: list[tuple[str, str]] = []
    for run in runs:
        nodes.append(
            Node(
                f"run-{run.pk}",
                "run",
                f"{RunKind(run.kind).label} #{run.pk}",
                RunStatus(run.status).label,
                run_url(run.pk),
                failed=run.status in (RunStatus.FAILED, RunStatus.CANCELLED),
            )
        )
        if run.snapshot_id:
            edges.append((f"snapshot-{run.snapshot_id}", f"run-{run.pk}"))
        if run.base_policy_id:
            edges.append((f"policy-{run.base_policy_id}", f"run-{run.pk}"))
        for model_id in (run.inputs.get("judges") or {}).values():
            edges.append((f"model-{model_id}", f"run-{run.pk}"))
    for policy in policies:
        made_by = policy.produced_by_id if policy.produced_by_id in run_ids else None
        nodes.append(Node(f"policy-{policy.pk}", "policy", policy.name, f"{policy.kind} policy", run_url(made_by)))
        if made_by:
            edges.append((f"run-{made_by}", f"policy-{policy.pk}"))
        # The parent is drawn straight to the child unless the path parent -> run -> child already shows it.
        if policy.parent_id and not (made_by and policy.produced_by.base_policy_id == policy.parent_id):
            edges.append((f"policy-{policy.parent_id}", f"policy-{policy.pk}"))
    for model in judge_models:
        made_by = model.run_id if model.run_id in run_ids else None
        nodes.append(Node(f"model-{model.pk}", "model", model.name, model.get_kind_display(), run_url(made_by)))
        if made_by:
            edges.append((f"run-{made_by}", f"model-{model.pk}"))
        elif model.snapshot_id:
            edges.append((f"snapshot-{model.snapshot_id}", f"model-{model.pk}"))
        for source in model.inputs.all():
            edges.append((f"model-{source.pk}", f"model-{model.pk}"))
    return nodes, edges


# --- Leaderboard ---------------------------------------------------------------------------------------------------


@require_GET
@login_required
def leaderboard(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    policies = list(
        PolicyVersion.objects.filter(project=project).select_related("parent").order_by("created_at", "id")
    )
    fit = fit_bradley_terry(outcomes_from_choices(version_comparison_counts(project.pk, gold=False)))
    win_rates = human_win_rates(policies)
    figures = _latest_figures(project)
    rows = []
    for policy in policies:
        latest = figures.get(policy.pk, {})
        rows.append(
            {
                "policy": policy,
                "strength": fit.get(policy.pk),
                "greedy": latest.get("heldout_success/greedy"),
                "sampled": latest.get("heldout_success/sampled"),
                "rm_score": latest.get("rm_score"),
                "win_rate": win_rates[policy.pk],
            }
        )
    rows.sort(key=lambda row: (row["strength"] is None, -(row["strength"].strength if row["strength"] else 0)))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank if row["strength"] else None
    chart = interval_chart(
        [(row["policy"].name, s.strength, s.low, s.high) for row in rows if (s := row["strength"])],
        title="Bradley-Terry strength, 95 % interval",
        x_label="strength (log-odds against the average version)",
    )
    context = {"project": project, "rows": rows, "chart": chart, "fitted": bool(fit), "prior": DEFAULT_PRIOR}
    return render(request, "feedback_app/dashboard/leaderboard.html", context)


def _latest_figures(project: Project) -> dict[int, dict[str, Evaluation]]:
    """Per policy version, the newest held-out success (per decoding) and reward-model score."""
    latest: dict[int, dict[str, Evaluation]] = defaultdict(dict)
    evaluations = Evaluation.objects.filter(
        project=project, policy_version__isnull=False, name__in=("heldout_success", "rm_score")
    ).order_by("-created_at", "-id")
    for evaluation in evaluations:
        key = f"{evaluation.name}/{evaluation.decoding}" if evaluation.decoding else evaluation.name
        latest[evaluation.policy_version_id].setdefault(key, evaluation)
    return latest
