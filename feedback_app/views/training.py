"""The researcher's training page: freeze labels into a snapshot, train judge models, fine-tune the policy, and
watch the runs (progress polled by htmx, cancel), the registry and the policy versions with their evaluations.

Every form posts, and a good one redirects back here (the run appears in the table at once, queued); a bad one
comes back with status 400 and the reasons beside the fields they name. The same checks as the REST API's run
the launch (`training.judges.create_judge_run`, `training.policy_runs.create_policy_run`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from feedback_app.access import MANAGER_ROLES, get_project_for_role
from feedback_app.exports.filters import ExportFilters, ExportKind, ExportRequestError
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.models import (
    DatasetSnapshot,
    Evaluation,
    JudgeKind,
    PolicyVersion,
    Project,
    RegisteredModel,
    RunKind,
    TrainingRun,
)
from feedback_app.models.trajectories import PolicyKind

TEMPLATE = "feedback_app/training.html"
# Export kinds worth freezing from the page (raw is for archives, not training).
SNAPSHOT_KINDS = [kind for kind in ExportKind if kind != ExportKind.RAW]


@require_GET
@login_required
def training_page(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    return _page(request, project)


@require_GET
@login_required
def runs_fragment(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The runs table alone, polled by the page while a run is queued or running."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    return render(request, TEMPLATE + "#runs", _runs_context(project))


@require_GET
@login_required
def run_page(request: HttpRequest, project_pk: int, run_pk: int) -> HttpResponse:
    """One run: progress, the metrics series, its held-out figures, a generative critic's sample critiques, the
    log and the error; polled while it is not finished."""
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    run = get_object_or_404(TrainingRun.objects.select_related("base_policy", "snapshot"), project=project, pk=run_pk)
    names = sorted({name for point in run.metrics for name in point if name != "step"})
    context = {
        "project": project,
        "run": run,
        "metric_names": names,
        "metric_rows": [[point.get("step"), *(point.get(name) for name in names)] for point in run.metrics[-50:]],
        "figures": {k: v for k, v in (run.summary.get("metrics") or {}).items() if isinstance(v, (int, float))},
        "samples": run.summary.get("samples") or [],
    }
    return render(request, "feedback_app/run.html#run" if request.htmx else "feedback_app/run.html", context)


@require_POST
@login_required
def make_snapshot(request: HttpRequest, project_pk: int) -> HttpResponse:
    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    kind, name = request.POST.get("export_kind", ""), request.POST.get("name", "")
    if kind not in ExportKind._value2member_map_:
        return _page(request, project, errors={"snapshot": {"export_kind": f"not an export kind: {kind!r}"}})
    try:
        filters = ExportFilters.from_query({"ties": request.POST["ties"]} if request.POST.get("ties") else {})
        snapshot = create_snapshot(project, kind, filters, user=request.user, name=name)
    except ExportRequestError as exc:
        return _page(request, project, errors={"snapshot": exc.errors})
    messages.success(request, f"Snapshot {snapshot.name!r}: {snapshot.row_count} {kind} rows frozen.")
    return _back(project)


@require_POST
@login_required
def launch_judge(request: HttpRequest, project_pk: int) -> HttpResponse:
    from training.judges import create_judge_run
    from training.tasks import train_judge

    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    errors: dict[str, str] = {}
    config = _settings(request, errors)
    snapshot = _pick(project.snapshots, request.POST.get("snapshot"), "snapshot", errors)
    judges = {
        setting: model
        for setting in ("reward_model", "prm")
        if (model := _pick(project.registered_models, request.POST.get(setting), setting, errors)) is not None
    }
    launch = {"snapshot": snapshot, "config": config, "judges": judges}
    return _launch(request, project, "judge", create_judge_run, train_judge, errors, launch)


@require_POST
@login_required
def launch_policy(request: HttpRequest, project_pk: int) -> HttpResponse:
    from training.policy_runs import TRAINERS, create_policy_run
    from training.tasks import train_policy

    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    kind = request.POST.get("kind", "")
    errors: dict[str, str] = {}
    config = _settings(request, errors)
    base = _pick(project.policy_versions, request.POST.get("base_policy"), "base_policy", errors)
    snapshot = _pick(project.snapshots, request.POST.get("snapshot"), "snapshot", errors)
    # One choice per judge kind on the form; the method decides which of its settings each one fills.
    chosen = {
        judge_kind: model
        for judge_kind in JudgeKind.values
        if (model := _pick(project.registered_models, request.POST.get(judge_kind), judge_kind, errors))
    }
    trainer = TRAINERS.get(kind)
    judges = {}
    for setting, judge_kinds in trainer.judge_inputs.items() if trainer else ():
        picked = [chosen[judge_kind] for judge_kind in judge_kinds if judge_kind in chosen]
        if picked:
            judges[setting] = picked[0]
    review = {"enabled": request.POST.get("review") == "on"}
    if request.POST.get("review_tasks"):
        try:
            review["num_tasks"] = int(request.POST["review_tasks"])
        except ValueError:
            errors["review.num_tasks"] = "must be a whole number"
    snapshot = snapshot if trainer and trainer.export_kinds else None
    launch = {"base_policy": base, "snapshot": snapshot, "judges": judges, "config": config, "review": review}
    return _launch(request, project, "policy", create_policy_run, train_policy, errors, launch)


@require_POST
@login_required
def cancel_run(request: HttpRequest, project_pk: int, run_pk: int) -> HttpResponse:
    from training.runs import request_cancel

    project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
    run = get_object_or_404(TrainingRun, project=project, pk=run_pk)
    if request_cancel(run):
        messages.info(request, f"Run {run.pk}: cancel requested.")
    else:
        messages.warning(request, f"Run {run.pk} had already finished.")
    if request.htmx:
        return render(request, TEMPLATE + "#runs", _runs_context(project))
    return _back(project)


# --- helpers -------------------------------------------------------------------------------------------------------


def _launch(request, project, form: str, create, task, errors: dict[str, str], launch: dict) -> HttpResponse:
    """Store the run through `create` unless the form already failed; then queue it on `task` and go back to the
    page, or show the page again (400) with every reason beside the `form` it belongs to."""
    from training.judges import LaunchError

    if not errors:
        try:
            run = create(project, request.POST.get("kind", ""), **launch, created_by=request.user)
        except LaunchError as exc:
            errors = exc.errors
    if errors:
        return _page(request, project, errors={form: errors})
    task.delay_on_commit(run.pk)
    source = f" from {run.base_policy.name}" if run.base_policy else ""
    messages.success(request, f"{run.get_kind_display()} run {run.pk} queued{source}.")
    return _back(project)


def _back(project: Project) -> HttpResponse:
    return HttpResponseRedirect(reverse("training", args=[project.pk]), status=303)


def _settings(request: HttpRequest, errors: dict[str, str]) -> dict[str, Any]:
    """The form's settings: a JSON object (advanced), plus the name of what the run will make."""
    text = request.POST.get("settings", "").strip()
    config: dict[str, Any] = {}
    if text:
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            errors["settings"] = f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        else:
            if not isinstance(config, dict):
                errors["settings"] = 'must be a JSON object, e.g. {"max_steps": 50}'
                config = {}
    if request.POST.get("name", "").strip():
        config["name"] = request.POST["name"].strip()
    return config


def _pick(related, value: str | None, field_name: str, errors: dict[str, str]):
    """The project's object with primary key `value` from `related` (a project relation), None when empty."""
    if not value:
        return None
    found = related.filter(pk=value).first() if value.isdigit() else None
    if found is None:
        errors[field_name] = f"no such choice in this project: {value!r}"
    return found


def _runs_context(project: Project) -> dict[str, Any]:
    runs = list(
        TrainingRun.objects.filter(project=project)
        .select_related("base_policy", "snapshot")
        .prefetch_related("produced_policies")
        .order_by("-created_at", "-id")[:25]
    )
    return {"project": project, "runs": runs, "active": any(not run.is_finished for run in runs)}


def _page(request: HttpRequest, project: Project, *, errors: dict[str, dict[str, str]] | None = None) -> HttpResponse:
    from training.policy_runs import TRAINERS
    from training.review import human_win_rate

    evaluations: dict[int, list[Evaluation]] = defaultdict(list)
    for evaluation in Evaluation.objects.filter(project=project, policy_version__isnull=False).order_by("-id"):
        evaluations[evaluation.policy_version_id].append(evaluation)
    policies = list(
        PolicyVersion.objects.filter(project=project)
        .select_related("parent", "produced_by")
        .order_by("-created_at", "-id")
    )
    for policy in policies:
        latest = _latest_by_name(evaluations[policy.pk])
        policy.greedy = latest.get("heldout_success/greedy")
        policy.sampled = latest.get("heldout_success/sampled")
        policy.rm_score = latest.get("rm_score")
        policy.win_rate = human_win_rate(policy) if policy.parent_id else None
    context = {
        **_runs_context(project),
        "snapshots": DatasetSnapshot.objects.filter(project=project).order_by("-created_at", "-id"),
        "models": RegisteredModel.objects.filter(project=project).order_by("-created_at", "-id"),
        "policies": policies,
        "local_policies": [p for p in policies if p.kind == PolicyKind.LOCAL],
        "snapshot_kinds": SNAPSHOT_KINDS,
        # The judge models some method takes, in the registry's order.
        "judge_kinds": [
            (value, label)
            for value, label in JudgeKind.choices
            if any(value in kinds for trainer in TRAINERS.values() for kinds in trainer.judge_inputs.values())
        ],
        "judge_run_kinds": [(k, RunKind(k).label) for k in JudgeKind.values],
        "methods": [(kind, RunKind(kind).label, trainer) for kind, trainer in TRAINERS.items()],
        "errors": errors or {},
        "posted": request.POST if request.method == "POST" else {},
    }
    return render(request, TEMPLATE, context, status=400 if errors else 200)


def _latest_by_name(evaluations: list[Evaluation]) -> dict[str, Evaluation]:
    """The newest figure of each name (and decoding): `heldout_success/greedy`, `rm_score`, ..."""
    latest: dict[str, Evaluation] = {}
    for evaluation in evaluations:  # newest first
        key = f"{evaluation.name}/{evaluation.decoding}" if evaluation.decoding else evaluation.name
        latest.setdefault(key, evaluation)
    return latest
