"""The researcher's training page: freeze labels into a snapshot, launch any kind of run, and see the runs, the
registry and the policy versions with their evaluations. The runs table and each run's own page are
`training_runs`; the launch form's inputs are `launch_form`.

The launch form is one per run kind, generated from the kind's config dataclass (`feedback_app.launch_forms`); a
kind selector swaps it in by htmx (and works as a plain GET without JavaScript). A good launch redirects to the new
run's page; a bad one comes back with status 400 and each reason beside the input it names. Launch and re-run go
through `launch_forms.launching.launch_run`, i.e. the same create functions and checks as the REST API.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from feedback_app.access import MANAGER_ROLES, get_project_for_role
from feedback_app.exports.filters import ExportFilters, ExportKind, ExportRequestError
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.launch_forms.forms import LAUNCH_KINDS, RunForm, config_from_form, run_form
from feedback_app.launch_forms.guidance import TINY_RECIPES
from feedback_app.launch_forms.launching import launch_run, launch_values, rerun
from feedback_app.launch_forms.new_snapshot import SNAPSHOT_FILTERS, NewSnapshot
from feedback_app.models import DatasetSnapshot, Evaluation, PolicyVersion, Project, RegisteredModel, TrainingRun
from feedback_app.views.launch_form import estimate_context, launch_form_context
from feedback_app.views.training_runs import runs_context
from feedback_app.win_rates import human_win_rates
from training.launch import LaunchError

TEMPLATE = "feedback_app/training.html"
# Export kinds worth freezing from the page (raw is for archives, not training).
SNAPSHOT_KINDS = [kind for kind in ExportKind if kind != ExportKind.RAW]


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
        launch = launch_form_context(project, kind, values)
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
    context = {"project": project, "launch": {"form": form, "estimate": estimate_context(project, form, values)}}
    return render(request, TEMPLATE + "#launch-estimate", context)


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
        **runs_context(project),
        "snapshots": DatasetSnapshot.objects.filter(project=project).order_by("-created_at", "-id"),
        "models": RegisteredModel.objects.filter(project=project).order_by("-created_at", "-id"),
        "policies": policies,
        "snapshot_kinds": SNAPSHOT_KINDS,
        "launch": launch_form_context(project, kind, values, launch_errors),
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
