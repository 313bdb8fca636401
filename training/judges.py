"""Judge-model runs: reward model, process reward model, value critic and generative critic.

A run reads one `DatasetSnapshot` (never ad-hoc queries), checks its bytes against the stored hash, and hands the
file to the Django-free pipeline in `reward_models`, with the run recorder as its reporter (progress, metrics, log,
and cancel within one optimiser step). The finished model is registered with its lineage (run, snapshot, base
model, judge models it used) and its held-out figures become `Evaluation` rows.

The run directory is ``ARTIFACT_ROOT/models/<project>/<kind>-run-<id>``, the same for every attempt, so a run taken
up again after its worker was killed resumes from the pipeline's last checkpoint there.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from django.conf import settings
from django.db import transaction

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
from feedback_app.models.locations import LocationError, check_model_path
from reward_models import critic_lm, prm, value
from reward_models.common.artifacts import CHECKPOINT_DIR
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune import preference_model
from reward_models.reward import train as reward_pipeline
from reward_models.reward.config import RewardConfig
from training import data_checks, launch_checks
from training.launch_checks import LaunchError, default_base_policy
from training.runs import RunRecorder

# Settings Tandem fills in itself from the run; a launch may not set them.
MANAGED_SETTINGS = ("data_path", "base_model", "output_dir", "snapshot_hash")


@dataclass(frozen=True)
class Pipeline:
    """A judge kind's pipeline (its config class, its `main` and its own check of its rows), which snapshot kinds it
    reads, and which other judge models it may use (config setting -> judge kind)."""

    config_class: type
    main: Callable[..., dict[str, Any]]
    row_problems: Callable[[list[dict[str, Any]], Any], dict[int, str]]
    export_kinds: tuple[str, ...]
    judge_inputs: Mapping[str, str] | None = None

    @classmethod
    def of(cls, module: ModuleType, config_class: type, export_kinds: tuple[str, ...], **options: Any) -> Pipeline:
        """The pipeline whose `main` and `row_problems` are `module`'s."""
        return cls(config_class, module.main, module.row_problems, export_kinds, **options)


PIPELINES: dict[str, Pipeline] = {
    RunKind.REWARD_MODEL: Pipeline.of(reward_pipeline, RewardConfig, ("preference",)),
    RunKind.PRM: Pipeline.of(prm, prm.PRMConfig, ("stepwise",)),
    RunKind.VALUE_CRITIC: Pipeline.of(
        value,
        value.ValueConfig,
        ("returns",),
        judge_inputs={"reward_model": JudgeKind.REWARD_MODEL, "prm": JudgeKind.PRM},
    ),
    RunKind.GENERATIVE_CRITIC: Pipeline.of(critic_lm, critic_lm.CriticConfig, ("critiques",)),
    RunKind.PREFERENCE_MODEL: Pipeline.of(preference_model, preference_model.PreferenceModelConfig, ("preference",)),
}
JUDGE_RUN_KINDS = tuple(PIPELINES)


def run_output_dir(run: TrainingRun) -> Path:
    return Path(settings.ARTIFACT_ROOT) / "models" / str(run.project_id) / f"{run.kind}-run-{run.pk}"


def judge_config(run: TrainingRun) -> Any:
    """The pipeline config for `run`: its stored settings, plus the snapshot file, base model, run directory and
    judge-model inputs Tandem fills in. Raises `ConfigError` naming the bad setting."""
    config_class = PIPELINES[run.kind].config_class
    return config_from_dict(config_class, judge_config_values(run))


def judge_config_values(run: TrainingRun) -> dict[str, Any]:
    """`judge_config`'s values, before its checks. A run not yet stored (a launch being checked) may lack its
    snapshot or base: the values then lack them."""
    values = {name: value for name, value in run.config.items() if name != "name"}
    for name in MANAGED_SETTINGS:
        if name in values:
            raise ConfigError(name, "is set by Tandem from the run (snapshot, base policy, run directory)")
    if run.snapshot is not None:
        values["data_path"] = str(run.snapshot.file)
        values["snapshot_hash"] = run.snapshot.content_hash
    try:
        if run.base_policy is not None:
            values["base_model"] = run.base_policy.policy_spec()["path"]
        elif run.inputs.get("base_model"):
            values["base_model"] = check_model_path(run.project_id, run.inputs["base_model"])
    except LocationError as exc:
        raise ConfigError("base_model", str(exc)) from None
    values["output_dir"] = str(run_output_dir(run))
    values.update(judge_model_paths(run))
    return values


def judge_model_paths(run: TrainingRun) -> dict[str, str]:
    """The directory of each registered judge model `run` uses, by the config setting it fills in."""
    return {
        setting: RegisteredModel.objects.get(pk=model_id, project=run.project).path
        for setting, model_id in (run.inputs.get("judges") or {}).items()
    }


def create_judge_run(
    project: Project,
    kind: str,
    *,
    snapshot: DatasetSnapshot | None,
    base_policy: PolicyVersion | None = None,
    base_model: str = "",
    config: Mapping[str, Any] | None = None,
    judges: Mapping[str, RegisteredModel] | None = None,
    created_by=None,
) -> TrainingRun:
    """Check a launch and store the queued run (the caller enqueues `training.tasks.train_judge` on commit).
    `base_model` is a model directory visible to the workers, for a base that is not one of the project's policy
    versions. Raises `LaunchError` naming every bad field; nothing is stored then."""
    errors: dict[str, str] = {}
    pipeline = PIPELINES.get(kind)
    if pipeline is None:
        raise LaunchError({"kind": f"not a judge-model kind; the kinds are {', '.join(JUDGE_RUN_KINDS)}"})
    if snapshot is None:
        errors["snapshot"] = "a judge model trains on a dataset snapshot; make one from an export first"
    elif problem := launch_checks.snapshot_error(snapshot, project, kind, pipeline.export_kinds):
        errors["snapshot"] = problem
    if base_policy is not None and base_model:
        errors["base_model"] = "give a base policy or a base model directory, not both"
    if base_policy is None and not base_model:
        base_policy = default_base_policy(project)
        if base_policy is None:
            errors["base_policy"] = "the project has no policy with local weights; name a base model directory"
    if base_policy is not None and (
        problem := launch_checks.base_policy_error(base_policy, project, "a judge model needs local weights")
    ):
        errors["base_policy"] = problem
    if base_model:
        try:
            check_model_path(project.pk, base_model)
        except LocationError as exc:
            errors["base_model"] = str(exc)
    if problem := launch_checks.name_error(config, project.registered_models, "registered model"):
        errors["config.name"] = problem
    judge_ids: dict[str, int] = {}
    allowed_judges = pipeline.judge_inputs or {}
    for setting, model in (judges or {}).items():
        if setting not in allowed_judges:
            errors[f"judges.{setting}"] = f"a {kind} run takes no {setting!r} judge model"
        elif problem := launch_checks.judge_model_error(model, project, (allowed_judges[setting],)):
            errors[f"judges.{setting}"] = problem
        else:
            judge_ids[setting] = model.pk
    inputs: dict[str, Any] = {"judges": judge_ids}
    if base_model and "base_model" not in errors:
        inputs["base_model"] = base_model
    run = launch_checks.unsaved_run(
        project,
        kind,
        config=config,
        snapshot=snapshot,
        base_policy=base_policy,
        inputs=inputs,
        created_by=created_by,
        errors=errors,
    )
    pipeline_config = _checked_config(run, pipeline, errors)
    if pipeline_config is not None:
        rows = data_checks.checked_rows(run.snapshot, pipeline.row_problems, pipeline_config, errors)
        if rows is not None:
            inputs["data"] = {"rows": len(rows)}
            if warning := data_checks.small_data_warning(len(rows), pipeline_config.batch_size, "rows"):
                inputs["data"]["warning"] = warning
    return launch_checks.stored(run, errors)


def _checked_config(run: TrainingRun, pipeline: Pipeline, errors: dict[str, str]) -> Any:
    """The pipeline config of a run being launched, or None with its errors added to `errors`. A base model that
    cannot be filled in is put to the input it comes from: the model directory the launch named, else the base
    policy; a setting Tandem fills in that the config sets by hand is put to that setting."""
    try:
        values = judge_config_values(run)
    except ConfigError as exc:  # a setting Tandem fills in, set by hand; or the base's weights are gone
        if exc.field == "base_model" and "base_model" not in run.config:
            errors.setdefault("base_model" if "base_model" in run.inputs else "base_policy", exc.reason)
        else:
            errors.setdefault(f"config.{exc.field}", exc.reason)
        return None
    return launch_checks.checked_config(
        pipeline.config_class, values, lambda field_name: _input_name(field_name, pipeline, errors), errors
    )


def _input_name(field_name: str, pipeline: Pipeline, errors: Mapping[str, str]) -> str:
    """The launch input a pipeline setting comes from: the base model comes from the base policy, unless the
    launch named a model directory instead that was refused (its error already says what is wrong)."""
    if field_name in (pipeline.judge_inputs or {}):
        return f"judges.{field_name}"
    if field_name == "base_model":
        return "base_model" if "base_model" in errors else "base_policy"
    return "snapshot" if field_name == "data_path" else f"config.{field_name}"


def run_judge(run: TrainingRun, recorder: RunRecorder) -> dict[str, Any]:
    """The Celery task's body: verify the snapshot, train, register."""
    data_checks.check_unchanged(run.snapshot)
    pipeline = PIPELINES[run.kind]
    main = pipeline.main
    config = judge_config(run)
    TrainingRun.objects.filter(pk=run.pk).update(artifact_dir=config.output_dir)
    recorder.log(
        f"{run.get_kind_display()} on snapshot {run.snapshot.name!r} ({run.snapshot.row_count} rows, "
        f"{run.snapshot.content_hash[:12]}) from {config.base_model}"
    )
    summary = main(config, recorder)
    model = register(run, config, summary)
    shutil.rmtree(Path(config.output_dir) / CHECKPOINT_DIR, ignore_errors=True)
    recorder.log(f"registered {model.name}: {_headline(summary.get('metrics') or {})}")
    return {**json_safe(summary), "registered_model": model.pk, "config": json_safe(asdict(config))}


def register(run: TrainingRun, config: Any, summary: Mapping[str, Any]) -> RegisteredModel:
    """Record the run's model in the registry, and its held-out figures as evaluations. Idempotent per run."""
    metrics = json_safe(summary.get("metrics") or {})
    with transaction.atomic():
        model, _ = RegisteredModel.objects.update_or_create(
            run=run,
            defaults={
                "project": run.project,
                "name": run.config.get("name") or f"{run.kind}-{run.pk}",
                "kind": run.kind,
                "path": config.output_dir,
                "snapshot": run.snapshot,
                "snapshot_hash": run.snapshot.content_hash,
                "base_policy": run.base_policy,
                "base_model": config.base_model,
                "metrics": metrics,
            },
        )
        model.inputs.set((run.inputs.get("judges") or {}).values())
        Evaluation.objects.filter(run=run).delete()
        n = int(summary.get("eval_samples") or 0)
        Evaluation.objects.bulk_create(
            Evaluation(project=run.project, run=run, name=name[:64], value=value, n=n)
            for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)  # json_safe made NaN None
        )
    return model


def _headline(metrics: Mapping[str, Any]) -> str:
    shown = [f"{name} {value:.3f}" for name, value in metrics.items() if isinstance(value, float)][:4]
    return ", ".join(shown) or "no held-out figures"


def json_safe(value: Any) -> Any:
    """Summaries go into JSON columns: NaN and infinities become None, tuples lists, paths strings."""
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
