"""The researcher's training page: freeze labels into a snapshot, launch any kind of run, and watch the runs (live
progress with an ETA, cancel, re-run), the registry and the policy versions with their evaluations; and a page per
run with its progress, metric curves, held-out figures, config and log tail, polled by htmx while it runs.

The launch form is one per run kind, generated from the kind's config dataclass (`feedback_app.launch_forms`); a
kind selector swaps it in by htmx (and works as a plain GET without JavaScript). A good launch redirects to the new
run's page; a bad one comes back with status 400 and each reason beside the input it names. Launch and re-run go
through `launch_forms.launch_run`, i.e. the same create functions and checks as the REST API.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
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
from feedback_app.exports.filters import ExportFilters, ExportKind, ExportRequestError
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.launch_forms import (
    LAUNCH_KINDS,
    SNAPSHOT_FILTERS,
    TINY_RECIPES,
    NewSnapshot,
    RunForm,
    Setting,
    config_from_form,
    estimate,
    launch_run,
    launch_values,
    rerun,
    run_form,
)
from feedback_app.models import (
    DatasetSnapshot,
    Evaluation,
    PolicyVersion,
    Project,
    RegisteredModel,
    RunKind,
    TrainingRun,
)
from feedback_app.models.trajectories import PolicyKind
from feedback_app.win_rates import human_win_rates
from training.launch import LaunchError, request_cancel

TEMPLATE = "feedback_app/training.html"
RUN_TEMPLATE = "feedback_app/run.html"
# Export kinds worth freezing from the page (raw is for archives, not training).
SNAPSHOT_KINDS = [kind for kind in ExportKind if kind != ExportKind.RAW]
LOG_TAIL_LINES = 80
# A chart of more points than this draws every k-th (and the last): the curve reads the same, the page stays light.
MAX_CHART_POINTS = 300
# Metric names whose curves come first on the run page, in this order; the rest follow alphabetically.
HEADLINE_METRICS = ("loss", "reward", "kl", "acc")
# Policy trainers whose progress counts iterations of rollouts and updates rather than optimiser steps.
ONLINE_KINDS = (RunKind.PPO, RunKind.NASH_MD, RunKind.SPO)


@require_GET
@login_required
@vary_on_headers("HX-Request")
def training_page(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The page; with `?kind=` the launch form of that kind, which is all an htmx request (the kind selector) gets;
    with `?recipe=tiny` too, that form filled in with the settings the project's benchmarks found to work for the
    built-in tiny models."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    kind = request.GET.get("kind", "")
    kind = kind if kind in LAUNCH_KINDS else LAUNCH_KINDS[0]
    values = dict(TINY_RECIPES.get(kind, {})) if request.GET.get("recipe") == "tiny" else None
    if request.htmx:
        launch = _launch_form(project, kind, values)
        return render(request, TEMPLATE + "#launch-form", {"project": project, "launch": launch})
    return _page(request, project, kind=kind, values=values)


@require_GET
@login_required
def launch_estimate(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The launch form's rough run time for the settings it holds now (the form asks again on every change)."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    try:
        form = run_form(request.GET.get("kind", ""))
    except LaunchError:
        return HttpResponse(status=204)
    values = _posted_values(request.GET)
    context = {"project": project, "launch": {"form": form, "estimate": _estimate(project, form, values)}}
    return render(request, TEMPLATE + "#launch-estimate", context)


@require_GET
@login_required
def runs_fragment(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The runs table alone, polled by the page while a run is queued or running."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    return render(request, TEMPLATE + "#runs", _runs_context(project))


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
    return render(request, RUN_TEMPLATE + "#run" if request.htmx else RUN_TEMPLATE, _run_context(project, run))


@require_POST
@login_required
def make_snapshot(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    kind, name = request.POST.get("export_kind", ""), request.POST.get("name", "")
    if kind not in ExportKind._value2member_map_:
        return _page(request, project, snapshot_errors={"export_kind": f"not an export kind: {kind!r}"})
    try:
        filters = ExportFilters.from_query({"ties": request.POST["ties"]} if request.POST.get("ties") else {})
        snapshot = create_snapshot(project, kind, filters, user=request.user, name=name)
    except ExportRequestError as exc:
        return _page(request, project, snapshot_errors=exc.errors)
    messages.success(request, f"Snapshot {snapshot.name!r}: {snapshot.row_count} {kind} rows frozen.")
    return _back(project)


@require_POST
@login_required
def launch(request: HttpRequest, project_pk: int) -> HttpResponse:
    """Launch a run of any kind from its form (and freeze a snapshot from filters first when the form asks)."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    data = _posted_values(request.POST)
    try:
        form = run_form(data.get("kind", ""))
    except LaunchError as exc:
        return _page(request, project, launch_errors=exc.errors)
    launch_args, errors = _launch_args(project, form, data)
    confirmed = data.get("confirm_data") in ("true", "on")
    try:
        run = launch_run(
            project, form.kind, **launch_args, created_by=request.user, errors=errors, confirmed=confirmed
        )
    except LaunchError as exc:
        return _page(request, project, kind=form.kind, values=data, launch_errors=exc.errors)
    messages.success(request, f"{run.get_kind_display()} run {run.pk} queued.")
    return HttpResponseRedirect(reverse("training-run", args=[project.pk, run.pk]), status=303)


@require_POST
@login_required
def rerun_run(request: HttpRequest, project_pk: int, run_pk: int) -> HttpResponse:
    """A new run like this one (same kind, snapshot, base policy, judge models and settings); when that no longer
    passes the checks (a judge model gone, a setting no longer valid), the launch form filled in as this run was
    launched, with the reasons beside the inputs."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    old = get_object_or_404(
        TrainingRun.objects.select_related("project", "base_policy", "snapshot"), project=project, pk=run_pk
    )
    if old.kind not in LAUNCH_KINDS:
        messages.warning(request, f"{old.get_kind_display()} runs are not launched from the dashboard.")
        return HttpResponseRedirect(reverse("training-run", args=[project.pk, old.pk]), status=303)
    try:
        run = rerun(old, created_by=request.user)
    except LaunchError as exc:
        return _page(request, project, kind=old.kind, values=launch_values(old), launch_errors=exc.errors)
    messages.success(request, f"Re-run of run {old.pk}: {run.get_kind_display()} run {run.pk} queued.")
    return HttpResponseRedirect(reverse("training-run", args=[project.pk, run.pk]), status=303)


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
        return render(request, RUN_TEMPLATE + "#run", _run_context(project, run))
    if request.htmx:
        return render(request, TEMPLATE + "#runs", _runs_context(project))
    return _back(project)


# --- helpers -------------------------------------------------------------------------------------------------------


def _back(project: Project) -> HttpResponse:
    return HttpResponseRedirect(reverse("training", args=[project.pk]), status=303)


def _posted_values(query) -> dict[str, str]:
    """The form's inputs by name. A ticked checkbox follows its hidden "false", so the last value counts; the values
    of a multiple select are joined by commas, as the snapshot filters read them."""
    values = {key: query.getlist(key)[-1] for key in query}
    for snapshot_filter in SNAPSHOT_FILTERS:
        if snapshot_filter.input == "multiselect" and (key := f"new_snapshot.{snapshot_filter.name}") in query:
            values[key] = ",".join(query.getlist(key))
    return values


def _launch_args(project: Project, form: RunForm, data: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """`launch_run`'s arguments from the posted form, and the errors of the inputs that name nothing valid. The form
    names its base policy and its snapshot itself: nothing is taken for being the newest."""
    config, errors = config_from_form(form, data)
    args: dict[str, Any] = {"config": config}
    if not data.get("base_policy"):
        errors["base_policy"] = "choose the policy version this run starts from"
    args["base_policy"] = _pick(project.policy_versions, data.get("base_policy"), "base_policy", errors)
    args["judges"] = {}
    for choice in form.judges:
        name = f"judges.{choice.setting}"
        if model := _pick(project.registered_models, data.get(name), name, errors):
            args["judges"][choice.setting] = model
    if form.export_kinds and data.get("snapshot") == "new":
        args["new_snapshot"] = NewSnapshot.from_form(form, data)
    elif form.export_kinds:
        if not data.get("snapshot"):
            errors["snapshot"] = "choose the snapshot to train on, or make a new one from filters"
        args["snapshot"] = _pick(project.snapshots, data.get("snapshot"), "snapshot", errors)
    if form.family == "policy":
        args["review"] = _review(data, errors)
    return args, errors


def _pick(related, value: str | None, field_name: str, errors: dict[str, str]):
    """The project's object with primary key `value` from `related` (a project relation), None when empty."""
    if not value:
        return None
    found = related.filter(pk=value).first() if value.isdigit() else None
    if found is None:
        errors[field_name] = f"no such choice in this project: {value!r}"
    return found


def _review(data: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """The review options of a policy run: `review.enabled` (a checkbox) and `review.num_tasks`."""
    review: dict[str, Any] = {}
    if "review.enabled" in data:
        review["enabled"] = data["review.enabled"] in ("true", "on")
    if data.get("review.num_tasks", "").strip():
        try:
            review["num_tasks"] = int(data["review.num_tasks"])
        except ValueError:
            errors["review.num_tasks"] = "must be a whole number"
    return review


def _duration(delta: timedelta | None) -> str:
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
    run.elapsed_text = _duration(end - run.started_at) if run.started_at else ""
    run.eta_text = _duration(run.eta)
    run.rerunnable = run.kind in LAUNCH_KINDS
    run.phase_text = run.progress_phase or ("rolling out" if run.kind == RunKind.ROLLOUT else "training")
    counts_episodes = run.progress_phase or run.kind == RunKind.ROLLOUT
    run.unit = "episodes" if counts_episodes else ("iterations" if run.kind in ONLINE_KINDS else "steps")
    return run


def _runs_context(project: Project) -> dict[str, Any]:
    runs = list(
        TrainingRun.objects.filter(project=project)
        .select_related("base_policy", "snapshot")
        .prefetch_related("produced_policies")
        .order_by("-created_at", "-id")[:25]
    )
    return {"project": project, "runs": [_timing(run) for run in runs], "active": any(not r.is_finished for r in runs)}


def _run_context(project: Project, run: TrainingRun) -> dict[str, Any]:
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


# --- the launch form -----------------------------------------------------------------------------------------------


@dataclass
class Field:
    """One input of the launch form, ready for `_launch_field.html`. `name` is what it posts and the key of its
    error; `input` is select, multiselect (`value` holds the chosen values, comma-separated), checkbox, number, text,
    date or json."""

    name: str
    label: str
    input: str
    value: str = ""
    choices: list[tuple[str, str]] | None = None
    help: str = ""
    error: str = ""
    step: str = "any"

    @property
    def id(self) -> str:
        return "launch-" + self.name.replace(".", "-").replace("_", "-")

    @property
    def chosen(self) -> list[str]:
        """The values a multiple select has selected."""
        return self.value.split(",")


def _setting_field(setting: Setting) -> Field:
    inputs = {"checkbox": "checkbox", "int": "number", "float": "number", "json": "json", "choice": "select"}
    help_text = f"{setting.help} Default: {setting.shown(setting.default) or '(empty)'}."
    return Field(
        f"config.{setting.name}",
        setting.name,
        inputs.get(setting.input, "text"),
        setting.shown(setting.default),
        [(choice, choice) for choice in setting.choices] or None,
        help=help_text.strip(),
        step="1" if setting.input == "int" else "any",
    )


def _launch_form(
    project: Project, kind: str, values: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    """Everything the launch form of `kind` shows, with `values` (posted, or an old run's) over the defaults and
    each of `errors` beside its input; errors that name no input are listed above the form."""
    form = run_form(kind)
    values, errors = values or {}, errors or {}
    sections: dict[str, list[Field]] = {"data": [], "new_snapshot": [], "models": [], "output": []}
    if form.export_kinds:
        snapshots = list(
            DatasetSnapshot.objects.filter(project=project, export_kind__in=form.export_kinds)
            .select_related("created_by")
            .order_by("-created_at", "-id")
        )
        # No snapshot is chosen for the researcher: the newest may well be someone else's.
        choices = [("", "— choose a snapshot —")] if snapshots else []
        choices += [(str(s.pk), _snapshot_label(s)) for s in snapshots]
        choices.append(("new", "a new snapshot, made now from the filters below"))
        sections["data"].append(Field("snapshot", "Snapshot", "select", "" if snapshots else "new", choices))
        sections["new_snapshot"] += _new_snapshot_fields(project, form)
    sections["models"].append(_base_policy_field(project, form))
    models = list(RegisteredModel.objects.filter(project=project, kind__in={k for c in form.judges for k in c.kinds}))
    for choice in form.judges:
        options = [("", "none" if not choice.required else "— pick one —")]
        options += [(str(m.pk), m.name) for m in models if m.kind in choice.kinds]
        label = f"{choice.label}{' (required)' if choice.required else ''}"
        sections["models"].append(Field(f"judges.{choice.setting}", label, "select", "", options, help=choice.setting))
    if form.takes_name:
        made = "policy version" if form.family == "policy" else "registered model"
        sections["output"].append(Field("config.name", f"Name of the new {made}", "text", help="Optional."))
    if form.family == "policy":
        sections["output"].append(
            Field(
                "review.enabled",
                "Roll the new version out on review tasks and queue blind comparisons against its parent",
                "checkbox",
                "true",
            )
        )
        sections["output"].append(Field("review.num_tasks", "Review tasks", "number", "16", step="1"))
    if "confirm_data" in errors:  # too little data for the settings: launching anyway takes a tick
        sections["data"].append(Field("confirm_data", "Launch anyway", "checkbox", "false"))
    method = [_setting_field(setting) for setting in form.method_settings]
    shared = [_setting_field(setting) for setting in form.shared_settings]
    shown = set()
    for field in [*method, *shared, *(f for fields in sections.values() for f in fields)]:
        field.value = values.get(field.name, field.value)
        field.error = errors.get(field.name, "")
        shown.add(field.name)
    return {
        "form": form,
        "kinds": [(k, RunKind(k).label) for k in LAUNCH_KINDS],
        **sections,
        "new_snapshot_open": bool(sections["data"]) and sections["data"][0].value == "new",
        "method": method,
        "shared": shared,
        "shared_open": any(field.error for field in shared),
        "other_errors": {name: reason for name, reason in errors.items() if name not in shown},
        "recipe": kind in TINY_RECIPES,
        "estimate": _estimate(project, form, values),
    }


def _snapshot_label(snapshot: DatasetSnapshot) -> str:
    by = f", by {snapshot.created_by.username}" if snapshot.created_by else ""
    made = timezone.localtime(snapshot.created_at)
    return f"{snapshot.name} ({snapshot.export_kind}, {snapshot.row_count} rows{by}, {made:%Y-%m-%d %H:%M})"


def _estimate(project: Project, form: RunForm, values: dict[str, str]) -> dict[str, Any]:
    """The launch form's rough run time: the whole, and its parts in words."""
    snapshot = values.get("snapshot", "")
    rows = None
    if snapshot.isdigit():
        rows = DatasetSnapshot.objects.filter(project=project, pk=snapshot).values_list("row_count", flat=True).first()
    parts = estimate(form, values, rows)
    return {
        "total": _duration(timedelta(seconds=sum(seconds for _, seconds in parts))) if parts else "",
        "parts": [(what, _duration(timedelta(seconds=seconds))) for what, seconds in parts],
    }


def _base_policy_field(project: Project, form: RunForm) -> Field:
    """The policy version the run starts from (or rolls out): always the researcher's choice, never the newest by
    default, which may be someone else's."""
    policies = PolicyVersion.objects.filter(project=project).order_by("-created_at", "-id")
    if form.family == "rollout":
        policies = policies.exclude(kind=PolicyKind.EXTERNAL)
        label = "Policy version to roll out"
    else:
        policies = policies.filter(kind=PolicyKind.LOCAL)
        label = "Base policy (the policy version it starts from)" if form.family == "policy" else "Base model"
    choices = [("", "— choose —")] + [
        (str(p.pk), f"{p.name} ({timezone.localtime(p.created_at):%Y-%m-%d %H:%M})") for p in policies
    ]
    return Field("base_policy", label, "select", "", choices)


def _new_snapshot_fields(project: Project, form: RunForm) -> list[Field]:
    export_kinds = [(kind, kind) for kind in form.export_kinds]
    name = f"{form.kind}-{timezone.localtime():%Y%m%d-%H%M%S}"
    fields = [
        Field("new_snapshot.export_kind", "Export kind", "select", form.export_kinds[0], export_kinds),
        Field("new_snapshot.name", "New snapshot's name", "text", name),
    ]
    for snapshot_filter in SNAPSHOT_FILTERS:
        if not snapshot_filter.applies(form.export_kinds):
            continue
        choices = [(str(choice), str(choice)) for choice in snapshot_filter.choices] or None
        if snapshot_filter.name == "policy_versions":
            choices = [(str(p.pk), p.name) for p in project.policy_versions.order_by("-created_at", "-id")]
        default = "false" if snapshot_filter.input == "checkbox" else (choices[0][0] if choices else "")
        if snapshot_filter.input == "multiselect":
            default = ""  # nothing selected: no filter
        input_type = "number" if snapshot_filter.input == "float" else snapshot_filter.input
        fields.append(
            Field(f"new_snapshot.{snapshot_filter.name}", snapshot_filter.label, input_type, default, choices)
        )
    return fields


def _page(
    request: HttpRequest,
    project: Project,
    *,
    kind: str = LAUNCH_KINDS[0],
    values: dict[str, str] | None = None,
    launch_errors: dict[str, str] | None = None,
    snapshot_errors: dict[str, str] | None = None,
) -> HttpResponse:
    evaluations: dict[int, list[Evaluation]] = defaultdict(list)
    for evaluation in Evaluation.objects.filter(project=project, policy_version__isnull=False).order_by("-id"):
        evaluations[evaluation.policy_version_id].append(evaluation)
    policies = list(
        PolicyVersion.objects.filter(project=project)
        .select_related("parent", "produced_by")
        .order_by("-created_at", "-id")
    )
    win_rates = human_win_rates(policies)
    for policy in policies:
        latest = _latest_by_name(evaluations[policy.pk])
        policy.greedy = latest.get("heldout_success/greedy")
        policy.sampled = latest.get("heldout_success/sampled")
        policy.rm_score = latest.get("rm_score")
        policy.win_rate = win_rates[policy.pk]
    context = {
        **_runs_context(project),
        "snapshots": DatasetSnapshot.objects.filter(project=project).order_by("-created_at", "-id"),
        "models": RegisteredModel.objects.filter(project=project).order_by("-created_at", "-id"),
        "policies": policies,
        "snapshot_kinds": SNAPSHOT_KINDS,
        "launch": _launch_form(project, kind, values, launch_errors),
        "snapshot_errors": snapshot_errors or {},
        "posted": request.POST if snapshot_errors else {},
    }
    status = 400 if launch_errors or snapshot_errors else 200
    return render(request, TEMPLATE, context, status=status)


def _latest_by_name(evaluations: list[Evaluation]) -> dict[str, Evaluation]:
    """The newest figure of each name (and decoding): `heldout_success/greedy`, `rm_score`, ..."""
    latest: dict[str, Evaluation] = {}
    for evaluation in evaluations:  # newest first
        key = f"{evaluation.name}/{evaluation.decoding}" if evaluation.decoding else evaluation.name
        latest.setdefault(key, evaluation)
    return latest
