"""Storing a run of any launchable kind and queueing it once the transaction commits, through the same create
functions and checks as the REST API; and a re-run of an old run with its launch's inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from feedback_app.launch_forms.forms import RunForm, run_form
from feedback_app.launch_forms.new_snapshot import NewSnapshot
from feedback_app.models import DatasetSnapshot, PolicyVersion, Project, RegisteredModel, TrainingRun
from reward_models.common.config import config_errors, config_from_dict
from training import launch
from training.launch import LaunchError, RolloutConfig


def launch_run(
    project: Project,
    kind: str,
    *,
    snapshot: DatasetSnapshot | None = None,
    new_snapshot: NewSnapshot | None = None,
    base_policy: PolicyVersion | None = None,
    base_model: str = "",
    judges: Mapping[str, RegisteredModel] | None = None,
    config: Mapping[str, Any] | None = None,
    review: Mapping[str, Any] | None = None,
    created_by=None,
    errors: Mapping[str, str] | None = None,
    confirmed: bool = True,
) -> TrainingRun:
    """Store a run of `kind` through its family's create function and queue it once the transaction commits. With
    `new_snapshot`, freeze that snapshot first, in the same transaction: a launch that fails stores neither (and
    removes the file). Raises `LaunchError` naming every bad field at once: `errors` (what the form already found,
    e.g. a value that does not parse) with every check's. Unless `confirmed`, a run the snapshot would give less
    than a batch of data is refused too, its warning under ``confirm_data``."""
    form = run_form(kind)
    errors = dict(errors or {})
    with transaction.atomic():
        made = run = None
        if new_snapshot is not None:
            try:
                made = snapshot = new_snapshot.create(project, form, created_by)
            except LaunchError as exc:
                errors.update(exc.errors)
        try:
            run = _create(project, form, snapshot, base_policy, base_model, judges, config, review, created_by)
        except LaunchError as exc:
            # The snapshot not made from bad filters is reported beside those filters, not as a missing snapshot.
            snapshot_failed = any(name.startswith("new_snapshot.") for name in errors)
            for name, reason in exc.errors.items():
                if not (name == "snapshot" and snapshot_failed):
                    errors.setdefault(name, reason)  # what the form found first says more ("no such choice")
        warning = ((run.inputs or {}).get("data") or {}).get("warning") if run is not None else None
        if warning and not confirmed:
            errors["confirm_data"] = warning
        if errors:
            transaction.set_rollback(True)
            if made is not None:
                made.file.unlink(missing_ok=True)
            raise LaunchError(errors)
        launch.send(run)
    return run


def _create(project, form: RunForm, snapshot, base_policy, base_model, judges, config, review, user) -> TrainingRun:
    if form.family == "judge":
        return launch.create_judge_run(
            project, form.kind, snapshot=snapshot, base_policy=base_policy, base_model=base_model, judges=judges,
            config=config, created_by=user,
        )  # fmt: skip
    if form.family == "policy":
        return launch.create_policy_run(
            project, form.kind, snapshot=snapshot, base_policy=base_policy, judges=judges, config=config,
            review=review, created_by=user,
        )  # fmt: skip
    return _create_rollout(project, base_policy, config or {}, user)


def _create_rollout(project: Project, policy: PolicyVersion | None, values: Mapping[str, Any], user) -> TrainingRun:
    errors: dict[str, str] = {}
    policy = policy or project.policy_versions.exclude(kind="external").order_by("-created_at", "-id").first()
    if policy is None:
        errors["base_policy"] = "the project has no policy version Tandem can run"
    elif policy.kind == "external":
        errors["base_policy"] = f"{policy.name} is external: Tandem cannot run it, only import its trajectories"
    elif location := policy.location_errors():
        errors["base_policy"] = next(iter(location.values()))
    errors.update(
        {
            f"config.{name}" if name else "config": reason
            for name, reason in config_errors(RolloutConfig, values).items()
        }
    )
    if errors:
        raise LaunchError(errors)
    return launch.create_rollout_run(project, policy, config_from_dict(RolloutConfig, values), created_by=user)


def rerun(run: TrainingRun, *, created_by=None) -> TrainingRun:
    """A new run of the same kind with the same snapshot, base policy, judge models, settings and review options,
    through `launch_run`'s checks. Its product takes the default name (the old run's name belongs to the old run's
    model or policy version)."""
    run_form(run.kind)  # refuses a kind the dashboard does not launch (bootstrap, evaluation)
    config = {name: value for name, value in run.config.items() if name != "name"}
    chosen: dict[str, RegisteredModel] = {}
    missing: dict[str, str] = {}
    judge_ids = (run.inputs or {}).get("judges") or {}
    found = RegisteredModel.objects.in_bulk(judge_ids.values())
    for setting, model_id in judge_ids.items():
        if model_id in found:
            chosen[setting] = found[model_id]
        else:
            missing[f"judges.{setting}"] = f"the judge model the run used (id {model_id}) is no longer registered"
    if missing:
        raise LaunchError(missing)
    review = (run.inputs or {}).get("review") or {}
    return launch_run(
        run.project,
        run.kind,
        snapshot=run.snapshot,
        base_policy=run.base_policy,
        base_model=(run.inputs or {}).get("base_model", "") if run.base_policy is None else "",
        judges=chosen,
        config=config,
        review=review,
        created_by=created_by,
    )


def launch_values(run: TrainingRun) -> dict[str, str]:
    """The launch form's inputs filled in as `run` was launched (for a re-run that needs fixing)."""
    form = run_form(run.kind)
    values = {"kind": run.kind, "base_policy": str(run.base_policy_id or ""), "snapshot": str(run.snapshot_id or "")}
    for setting in form.settings:
        if setting.name in run.config:
            values[f"config.{setting.name}"] = setting.shown(run.config[setting.name])
    for setting, model_id in ((run.inputs or {}).get("judges") or {}).items():
        values[f"judges.{setting}"] = str(model_id)
    review = (run.inputs or {}).get("review") or {}
    if review:
        values["review.enabled"] = "true" if review.get("enabled", True) else "false"
        values["review.num_tasks"] = str(review.get("num_tasks", ""))
    return values
