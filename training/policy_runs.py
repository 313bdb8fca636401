"""Policy fine-tuning runs, and serving each new policy back for review.

A run starts from a local `PolicyVersion` (its weights are the policy and, unless the config names another, the
reference), reads a `DatasetSnapshot` when its method learns from labels offline (DPO, KTO, SFT) and the judge
models it needs from the registry (PPO: reward model, PRM, value critic; Nash-MD and SPO: a preference model;
GRPO: a reward model), and hands them to the Django-free trainer in `reward_models.finetune`, with the run recorder
as its reporter. A trainer's held-out evaluation of the base and the new policy becomes `Evaluation` rows.

Served back: a successful run registers a new `PolicyVersion` whose parent is the base, and (unless the launch set
`review` off) starts a rollout of it on the project's review tasks; when that rollout lands, comparisons of the new
version against its parent on the same tasks go to the annotators' queue at high priority, blind (policy names
hidden whatever the project's setting) and in random left/right order (`training.rollouts`).

The run directory is ``ARTIFACT_ROOT/policies/<project>/<kind>-run-<id>``, the same for every attempt, so a run
taken up again after its worker was killed resumes from the trainer's last checkpoint.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
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
from feedback_app.models.locations import LocationError
from feedback_app.models.trajectories import PolicyKind, TaskSplit
from reward_models.common.artifacts import CHECKPOINT_DIR
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune import dpo, grpo, kto, nash, ppo, ppo_config, sft
from training import data_checks, launch_checks
from training.judges import json_safe, judge_model_paths
from training.launch_checks import LaunchError, default_base_policy
from training.rollouts import RolloutConfig, create_rollout_run
from training.runs import RunRecorder

# Settings Tandem fills in itself from the run and the project; a launch may not set them.
MANAGED_SETTINGS = ("policy_path", "data_path", "output_dir", "snapshot_hash", "environment", "environment_config")


@dataclass(frozen=True)
class Trainer:
    """A method's trainer (its config class, its `main` and its own check of its rows), which snapshot kinds it
    learns from (none: it learns online) and the settings each implies, which judge models it takes (config
    setting -> the judge kinds that fit; `required` ones must be given), and the settings its run kind implies."""

    config_class: type
    main: Callable[..., dict[str, Any]]
    # None for a method that learns online, from no snapshot.
    row_problems: Callable[[list[dict[str, Any]], Any], dict[int, str]] | None
    export_kinds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    judge_inputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    required_judges: tuple[str, ...] = ()
    implied: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, module: ModuleType, config_class: type, *settings: Any, **options: Any) -> Trainer:
        """The trainer whose `main` and `row_problems` (where it reads rows) are `module`'s."""
        return cls(config_class, module.main, getattr(module, "row_problems", None), *settings, **options)


# A Nash-style trainer plays against a pairwise preference model, or a Bradley-Terry reward model's P(a > b).
PREFERENCE_JUDGES = {"preference_model_path": (JudgeKind.PREFERENCE_MODEL, JudgeKind.REWARD_MODEL)}

TRAINERS: dict[str, Trainer] = {
    RunKind.DPO: Trainer.of(
        dpo,
        dpo.DPOConfig,
        {"step_preference": {"level": "step"}, "preference": {"level": "trajectory"}},
    ),
    RunKind.KTO: Trainer.of(kto, kto.KTOConfig, {"unpaired": {}}),
    RunKind.SFT: Trainer.of(sft, sft.SFTConfig, {"sft": {}}),
    RunKind.PPO: Trainer.of(
        ppo,
        ppo_config.PPOConfig,
        judge_inputs={
            "reward_model_path": (JudgeKind.REWARD_MODEL,),
            "prm_path": (JudgeKind.PRM,),
            "value_critic_path": (JudgeKind.VALUE_CRITIC,),
        },
    ),
    RunKind.NASH_MD: Trainer.of(
        nash,
        nash.NashConfig,
        judge_inputs=PREFERENCE_JUDGES,
        required_judges=("preference_model_path",),
        implied={"method": "nash_md"},
    ),
    RunKind.SPO: Trainer.of(
        nash,
        nash.NashConfig,
        judge_inputs=PREFERENCE_JUDGES,
        required_judges=("preference_model_path",),
        implied={"method": "spo"},
    ),
    RunKind.GRPO: Trainer.of(
        grpo,
        grpo.GRPOConfig,
        judge_inputs={"reward_model_path": (JudgeKind.REWARD_MODEL,)},
        required_judges=("reward_model_path",),
    ),
}
POLICY_RUN_KINDS = tuple(TRAINERS)


@dataclass
class ReviewOptions:
    """What happens when the run succeeds: roll the new version out on review tasks and queue comparisons
    against its parent."""

    enabled: bool = True
    num_tasks: int = 16
    samples_per_task: int = 1
    priority: int = 10

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ReviewOptions:
        errors = {f"review.{name}": "unknown option" for name in values if name not in cls.__dataclass_fields__}
        options = cls(**{name: value for name, value in values.items() if name in cls.__dataclass_fields__})
        if not isinstance(options.enabled, bool):
            errors["review.enabled"] = "must be true or false"
        for name in ("num_tasks", "samples_per_task"):
            value = getattr(options, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
                errors[f"review.{name}"] = "must be a whole number from 1 to 1000"
        if isinstance(options.priority, bool) or not isinstance(options.priority, int):
            errors["review.priority"] = "must be a whole number"
        if errors:
            raise LaunchError(errors)
        return options


def run_output_dir(run: TrainingRun) -> Path:
    return Path(settings.ARTIFACT_ROOT) / "policies" / str(run.project_id) / f"{run.kind}-run-{run.pk}"


def policy_config(run: TrainingRun) -> Any:
    """The trainer config for `run`: its stored settings plus what Tandem fills in (the base policy's weights, the
    snapshot file, the run directory, the project's environment, the judge models' directories). Raises
    `ConfigError` naming the bad setting."""
    config_class = TRAINERS[run.kind].config_class
    return config_from_dict(config_class, policy_config_values(run))


def policy_config_values(run: TrainingRun) -> dict[str, Any]:
    """`policy_config`'s values, before its checks. A run not yet stored (a launch being checked) may lack its base
    policy: the values then lack its weights."""
    trainer = TRAINERS[run.kind]
    values = {name: value for name, value in run.config.items() if name != "name"}
    snapshot_settings = {name for implied in trainer.export_kinds.values() for name in implied}
    for name in (*MANAGED_SETTINGS, *trainer.judge_inputs, *trainer.implied, *snapshot_settings):
        if name in values:
            raise ConfigError(name, "is set by Tandem from the run (base policy, snapshot, judges, environment)")
    values.update(trainer.implied)
    if run.base_policy is not None:
        try:
            values["policy_path"] = run.base_policy.policy_spec()["path"]
        except LocationError as exc:
            raise ConfigError("base_policy", str(exc)) from None
    values["output_dir"] = str(run_output_dir(run))
    values["environment"] = run.project.environment.dotted_path
    values["environment_config"] = dict(run.project.environment.config or {})
    if run.snapshot is not None:
        values["data_path"] = str(run.snapshot.file)
        values["snapshot_hash"] = run.snapshot.content_hash
        values.update(trainer.export_kinds.get(run.snapshot.export_kind) or {})
    values.update(judge_model_paths(run))
    return values


def create_policy_run(
    project: Project,
    kind: str,
    *,
    base_policy: PolicyVersion | None = None,
    snapshot: DatasetSnapshot | None = None,
    judges: Mapping[str, RegisteredModel] | None = None,
    config: Mapping[str, Any] | None = None,
    review: Mapping[str, Any] | None = None,
    created_by=None,
) -> TrainingRun:
    """Check a launch and store the queued run (the caller enqueues `training.tasks.train_policy` on commit).
    Raises `LaunchError` naming every bad field; nothing is stored then."""
    trainer = TRAINERS.get(kind)
    if trainer is None:
        raise LaunchError({"kind": f"not a policy-training kind; the kinds are {', '.join(POLICY_RUN_KINDS)}"})
    errors: dict[str, str] = {}
    if base_policy is None:
        base_policy = default_base_policy(project)
        if base_policy is None:
            errors["base_policy"] = "the project has no policy with local weights to fine-tune"
    elif problem := launch_checks.base_policy_error(base_policy, project, "fine-tuning needs local weights"):
        errors["base_policy"] = problem
    if trainer.export_kinds:
        if snapshot is None:
            errors["snapshot"] = (
                f"a {kind} run learns from a {' or '.join(trainer.export_kinds)} snapshot; make one from an export"
            )
        elif problem := launch_checks.snapshot_error(snapshot, project, kind, trainer.export_kinds):
            errors["snapshot"] = problem
    elif snapshot is not None:
        errors["snapshot"] = f"a {kind} run learns online from its judge models; it takes no snapshot"
    judge_ids: dict[str, int] = {}
    for setting, model in (judges or {}).items():
        wanted = trainer.judge_inputs.get(setting)
        if wanted is None:
            takes = ", ".join(trainer.judge_inputs) or "none"
            errors[f"judges.{setting}"] = f"a {kind} run takes no {setting!r} judge model (it takes: {takes})"
        elif problem := launch_checks.judge_model_error(model, project, wanted):
            errors[f"judges.{setting}"] = problem
        else:
            judge_ids[setting] = model.pk
    for setting in trainer.required_judges:
        if setting not in (judges or {}):
            errors[f"judges.{setting}"] = (
                f"a {kind} run needs a registered {' or '.join(trainer.judge_inputs[setting])}"
            )
    if problem := launch_checks.name_error(config, project.policy_versions, "policy version"):
        errors["config.name"] = problem
    try:
        options = ReviewOptions.from_dict(review or {})
    except LaunchError as exc:
        errors.update(exc.errors)
        options = None
    run = launch_checks.unsaved_run(
        project,
        kind,
        config=config,
        snapshot=snapshot,
        base_policy=base_policy,
        inputs={"judges": judge_ids},
        created_by=created_by,
        errors=errors,
    )
    trainer_config = _checked_config(run, trainer, errors)
    data = _data(run, trainer, trainer_config, errors) if trainer_config is not None and snapshot else {}
    if options is not None:  # None: refused, and named in `errors`
        run.inputs["review"] = asdict(options)
    if data:
        run.inputs["data"] = data
    return launch_checks.stored(run, errors)


def _checked_config(run: TrainingRun, trainer: Trainer, errors: dict[str, str]) -> Any:
    """The trainer config of a run being launched, or None with its errors added to `errors`. Base policy weights
    that are gone are put to the base policy; a setting Tandem fills in that the config sets by hand is put to that
    setting."""
    try:
        values = policy_config_values(run)
    except ConfigError as exc:  # a setting Tandem fills in, set by hand; or the base policy's weights are gone
        errors.setdefault("base_policy" if exc.field == "base_policy" else f"config.{exc.field}", exc.reason)
        return None
    return launch_checks.checked_config(
        trainer.config_class, values, lambda field_name: _input_name(field_name, trainer), errors
    )


def _input_name(field_name: str, trainer: Trainer) -> str:
    """The launch input a trainer setting comes from."""
    if field_name in trainer.judge_inputs:
        return f"judges.{field_name}"
    return {"policy_path": "base_policy", "base_policy": "base_policy", "data_path": "snapshot"}.get(
        field_name, f"config.{field_name}"
    )


def _data(run: TrainingRun, trainer: Trainer, config: Any, errors: dict[str, str]) -> dict[str, Any]:
    """The snapshot's rows checked by the trainer's own check, and what the run would train on: ``rows`` and, for
    DPO, the pair counts it reports, with a ``warning`` when they make less than a batch."""
    rows = data_checks.checked_rows(run.snapshot, trainer.row_problems, config, errors)
    if rows is None:
        return {}
    data: dict[str, Any] = {"rows": len(rows)}
    # DPO is the trainer that leaves rows out by its settings (ties, balance), and whose batches are of rows; SFT and
    # KTO learn from every turn of a row, so their rows say little about their batches.
    if run.kind == RunKind.DPO:
        from reward_models.finetune.dpo import describe_counts, pair_counts

        counts = pair_counts(rows, config)
        data.update(counts, summary=describe_counts(counts, config))
        if warning := data_checks.small_data_warning(counts["used"], config.batch_size, "pairs", data["summary"]):
            data["warning"] = warning
    return data


def run_policy_training(run: TrainingRun, recorder: RunRecorder) -> dict[str, Any]:
    """The Celery task's body: verify the snapshot, train, register the new version and create its review rollout
    run (`training.tasks.train_policy` sends it to the worker)."""
    if run.snapshot is not None:
        data_checks.check_unchanged(run.snapshot)
    main = TRAINERS[run.kind].main
    config = policy_config(run)
    TrainingRun.objects.filter(pk=run.pk).update(artifact_dir=config.output_dir)
    data = f" on snapshot {run.snapshot.name!r} ({run.snapshot.row_count} rows)" if run.snapshot else ""
    recorder.log(f"{run.get_kind_display()} from {run.base_policy.name}{data}")
    summary = main(config, recorder)
    version = register_policy(run, config, summary)
    shutil.rmtree(Path(config.output_dir) / CHECKPOINT_DIR, ignore_errors=True)
    recorder.log(f"registered policy version {version.name}: {_headline(summary.get('metrics') or {})}")
    review_run = start_review(run, version)
    if review_run is not None:
        recorder.log(f"review rollout run {review_run.pk} queued on {review_run.config['num_tasks']} review tasks")
    return {
        **json_safe(summary),
        "policy_version": version.pk,
        "review_run": review_run.pk if review_run else None,
        "config": json_safe(asdict(config)),
    }


def register_policy(run: TrainingRun, config: Any, summary: Mapping[str, Any]) -> PolicyVersion:
    """The run's new policy version (parent: the base) and its held-out evaluations, and the base's under the same
    run. Idempotent per run: a run finished twice registers one version."""
    base = run.base_policy
    metrics = summary.get("metrics") or {}
    with transaction.atomic():
        version = PolicyVersion.objects.filter(produced_by=run).first()
        if version is None:
            version = PolicyVersion.objects.create(
                project=run.project,
                name=run.config.get("name") or f"{base.name}+{run.kind}-{run.pk}",
                kind=PolicyKind.LOCAL,
                weights_path=config.output_dir,
                generation=dict(base.generation or {}),
                parent=base,
                produced_by=run,
                notes=f"{run.get_kind_display()} run {run.pk} from {base.name}",
            )
        Evaluation.objects.filter(run=run).delete()
        Evaluation.objects.bulk_create(
            evaluation
            for policy, figures in ((base, metrics.get("base")), (version, metrics.get("final")))
            for evaluation in _success_evaluations(run, policy, figures or {})
        )
    return version


def _success_evaluations(run: TrainingRun, policy: PolicyVersion, figures: Mapping[str, Any]) -> list[Evaluation]:
    return [
        Evaluation(
            project=run.project,
            policy_version=policy,
            run=run,
            name="heldout_success",
            decoding=decoding,
            value=figures[f"{decoding}_success"],
            stderr=figures.get(f"{decoding}_stderr"),
            n=int(figures.get("tasks") or 0),
        )
        for decoding in ("greedy", "sampled")
        if isinstance(figures.get(f"{decoding}_success"), (int, float))
    ]


def start_review(run: TrainingRun, version: PolicyVersion) -> TrainingRun | None:
    """The rollout run of `version` on the project's review tasks that will send comparisons against its parent to
    the annotators (the training task sends it to the worker); None when the launch turned review off or the project
    has no review tasks. Idempotent."""
    options = ReviewOptions(**run.inputs.get("review", {}))
    if not options.enabled:
        return None
    existing = TrainingRun.objects.filter(kind=RunKind.ROLLOUT, base_policy=version, inputs__review_of=run.pk)
    if existing.exists():
        return existing.first()
    if not run.project.tasks.filter(split=TaskSplit.REVIEW).exists():
        return None
    config = RolloutConfig(
        split=TaskSplit.REVIEW,
        num_tasks=options.num_tasks,
        samples_per_task=options.samples_per_task,
        compare_with_parent=True,
        review_priority=options.priority,
        seed=run.pk,
    )
    review_run = create_rollout_run(run.project, version, config, created_by=run.created_by)
    TrainingRun.objects.filter(pk=review_run.pk).update(inputs={"review_of": run.pk})
    return review_run


def _headline(metrics: Mapping[str, Any]) -> str:
    base, final = metrics.get("base") or {}, metrics.get("final") or {}
    shown = [
        f"{decoding} success {base[key]:.3f} -> {final[key]:.3f}"
        for decoding in ("greedy", "sampled")
        if isinstance(base.get(key := f"{decoding}_success"), float) and isinstance(final.get(key), float)
    ]
    return ", ".join(shown) or "no held-out figures"
