"""The runs on the training page and a page per run: the runs table with each run's progress and ETA (polled while
a run is queued or running), a run's page with its progress, metric curves, held-out figures, config and log tail
(polled by htmx while it runs), and cancelling a run from either."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from feedback_app.access import MANAGER_ROLES, get_project_for_role
from feedback_app.charts import line_chart
from feedback_app.launch_forms.forms import LAUNCH_KINDS
from feedback_app.models import Project, RunKind, TrainingRun
from training.launch import request_cancel

RUN_TEMPLATE = "feedback_app/run.html"
RUNS_FRAGMENT = "feedback_app/training.html#runs"
LOG_TAIL_LINES = 80
# A chart of more points than this draws every k-th (and the last): the curve reads the same, the page stays light.
MAX_CHART_POINTS = 300
# Metric names whose curves come first on the run page, in this order; the rest follow alphabetically.
HEADLINE_METRICS = ("loss", "reward", "kl", "acc")
# Policy trainers whose progress counts iterations of rollouts and updates rather than optimiser steps.
ONLINE_KINDS = (RunKind.PPO, RunKind.NASH_MD, RunKind.SPO)


@require_GET
@login_required
def runs_fragment(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The runs table alone, polled by the page while a run is queued or running."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    return render(request, RUNS_FRAGMENT, runs_context(project))


@require_GET
@login_required
@vary_on_headers("HX-Request")
def run_page(request: HttpRequest, project_pk: int, run_pk: int) -> HttpResponse:
    """One run: progress with its ETA, metric curves, held-out figures, a generative critic's sample critiques, the
    config, the log tail and the error; polled while it is not finished. The metrics series is a column of the run's
    own row, so a poll costs the same few queries however long the series grows."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    run = get_object_or_404(
        TrainingRun.objects.select_related("base_policy", "snapshot", "created_by"), project=project, pk=run_pk
    )
    return render(request, RUN_TEMPLATE + "#run" if request.htmx else RUN_TEMPLATE, run_context(project, run))


@require_POST
@login_required
def cancel_run(request: HttpRequest, project_pk: int, run_pk: int) -> HttpResponse:
    """Cancel; from htmx, answer with what the button sits in: the run page's panel or the runs table."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    run = get_object_or_404(
        TrainingRun.objects.select_related("base_policy", "snapshot", "created_by"), project=project, pk=run_pk
    )
    if request_cancel(run):
        messages.info(request, f"Run {run.pk}: cancel requested.")
    else:
        messages.warning(request, f"Run {run.pk} had already finished.")
    if request.htmx and request.htmx.target == "run":
        run.refresh_from_db()
        return render(request, RUN_TEMPLATE + "#run", run_context(project, run))
    if request.htmx:
        return render(request, RUNS_FRAGMENT, runs_context(project))
    return HttpResponseRedirect(reverse("training", args=[project.pk]), status=303)


def duration_text(delta: timedelta | None) -> str:
    if delta is None:
        return ""
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _timing(run: TrainingRun) -> TrainingRun:
    """Annotate `run` with what its progress bar shows: the phase it is in (training, evaluating a policy, rolling
    out) and what it counts, percent done of the phase, time elapsed and the phase's ETA (time in the phase ×
    remaining / done, once it has made progress)."""
    run.percent = round(100 * run.progress_fraction)
    end = run.finished_at or timezone.now()
    run.elapsed_text = duration_text(end - run.started_at) if run.started_at else ""
    run.eta_text = duration_text(run.eta)
    run.rerunnable = run.kind in LAUNCH_KINDS
    run.phase_text = run.progress_phase or ("rolling out" if run.kind == RunKind.ROLLOUT else "training")
    counts_episodes = run.progress_phase or run.kind == RunKind.ROLLOUT
    run.unit = "episodes" if counts_episodes else ("iterations" if run.kind in ONLINE_KINDS else "steps")
    return run


def runs_context(project: Project) -> dict[str, Any]:
    runs = list(
        TrainingRun.objects.filter(project=project)
        .select_related("base_policy", "snapshot")
        .prefetch_related("produced_policies")
        .order_by("-created_at", "-id")[:25]
    )
    return {"project": project, "runs": [_timing(run) for run in runs], "active": any(not r.is_finished for r in runs)}


def run_context(project: Project, run: TrainingRun) -> dict[str, Any]:
    lines = run.log.splitlines()
    inputs = {name: value for name, value in (run.inputs or {}).items() if value}
    return {
        "project": project,
        "run": _timing(run),
        "data": _data_text(run),
        "charts": _metric_charts(run.metrics),
        "latest": _latest_metrics(run.metrics),
        "figures": {k: v for k, v in (run.summary.get("metrics") or {}).items() if isinstance(v, (int, float))},
        "samples": run.summary.get("samples") or [],
        "log_tail": "\n".join(lines[-LOG_TAIL_LINES:]),
        "log_lines": len(lines),
        "log_tail_lines": LOG_TAIL_LINES,
        "config_json": json.dumps(run.config, indent=2, sort_keys=True),
        "inputs_json": json.dumps(inputs, indent=2, sort_keys=True) if inputs else "",
        "resolved_json": json.dumps(run.summary["config"], indent=2, sort_keys=True)
        if run.summary.get("config")
        else "",
    }


def _data_text(run: TrainingRun) -> str:
    """What the run trains on, as its launch counted it from the snapshot: the rows and, for DPO, how many pairs it
    uses and why it leaves the others out; with the warning the launch was confirmed over."""
    data = (run.inputs or {}).get("data") or {}
    if not data:
        return ""
    text = data.get("summary") or f"{data['rows']} rows"
    return f"{text}. Launched anyway over the warning: {data['warning']}" if data.get("warning") else text


def _metric_series(metrics: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """{name: [(step, value), ...]} from the run's points (a point without a step counts by its position)."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for position, point in enumerate(metrics):
        step = point.get("step", position)
        for name, value in point.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series[name].append((step, value))
    return series


def _metric_order(name: str) -> tuple[int, str]:
    lowered = name.lower()
    rank = next((i for i, word in enumerate(HEADLINE_METRICS) if word in lowered), len(HEADLINE_METRICS))
    return rank, name


def _metric_charts(metrics: list[dict[str, Any]]) -> list[tuple[str, SafeString]]:
    """One small line chart per metric name: loss first, then reward, KL and accuracy, then the rest. A metric
    reported once (a summary such as total_flos or train_runtime) is no curve: the table of last values shows it."""
    charts = []
    for name, points in sorted(_metric_series(metrics).items(), key=lambda item: _metric_order(item[0])):
        if len(points) < 2:
            continue
        if len(points) > MAX_CHART_POINTS:
            stride = -(-len(points) // MAX_CHART_POINTS)
            points = points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
        charts.append((name, line_chart({name: points}, title=name, x_label="step", width=360, height=200)))
    return charts


def _latest_metrics(metrics: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(name, step, value) of each metric's last point."""
    series = _metric_series(metrics)
    return [(name, *series[name][-1]) for name in sorted(series, key=_metric_order)]
