"""The bootstrap run: supervised fine-tuning of a built-in environment's tiny policy, registered as a project's base
policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from django.conf import settings
from django.db import transaction

from feedback_app.models import Evaluation, PolicyVersion, Project, RunKind, TrainingRun
from reward_models.policy.bootstrap import BootstrapConfig
from reward_models.policy.bootstrap import main as bootstrap_main
from reward_models.policy.tool_bootstrap import ToolBootstrapConfig, uses_shipped
from reward_models.policy.tool_bootstrap import main as tool_bootstrap_main
from training.runs import RunRecorder, execute_run


@dataclass(frozen=True)
class Bootstrap:
    """How one built-in environment's tiny policy is bootstrapped: its pipeline, the environment settings it takes
    from the project, and where its metrics are."""

    config_class: type
    main: Callable[..., dict[str, Any]]
    env_fields: dict[str, str]  # project environment config key -> pipeline config field
    notes: str
    loss_curve: str
    mean_length: str  # the metric's name, after "greedy_" or "sampled_"


BOOTSTRAPS = {
    "reward_models.envs.gridworld.GridWorld": Bootstrap(
        BootstrapConfig,
        bootstrap_main,
        {"size": "grid_size", "wall_prob": "wall_prob", "max_steps": "max_episode_steps"},
        "Tiny Llama, supervised on noisy scripted demonstrations.",
        "loss_curve",
        "mean_length",
    ),
    "reward_models.envs.toolshop.ToolShop": Bootstrap(
        ToolBootstrapConfig,
        tool_bootstrap_main,
        {"difficulty": "difficulty", "max_turns": "max_turns"},
        "Tiny Qwen2 chat model with tool calls, supervised on noisy scripted demonstrations after a copy drill.",
        "demo_loss_curve",
        "mean_turns",
    ),
}


def bootstrap_for(run: TrainingRun) -> Bootstrap:
    environment = run.project.environment
    if environment.dotted_path not in BOOTSTRAPS:
        known = ", ".join(BOOTSTRAPS)
        raise ValueError(f"environment: the bootstrap trains policies for {known}, not {environment.dotted_path}")
    return BOOTSTRAPS[environment.dotted_path]


def bootstrap_config(run: TrainingRun) -> Any:
    """The run's settings over the project's environment config, so the policy learns the tasks the project uses."""
    bootstrap = bootstrap_for(run)
    environment = run.project.environment
    values = {k: v for k, v in run.config.items() if k != "policy_name"}
    unknown = set(values) - {f.name for f in fields(bootstrap.config_class)}
    if unknown:
        raise ValueError(f"unknown bootstrap settings: {sorted(unknown)}")
    for env_key, field_name in bootstrap.env_fields.items():
        if env_key in environment.config:
            values.setdefault(field_name, environment.config[env_key])
    if settings.TANDEM_TORCH_THREADS:
        values.setdefault("num_threads", settings.TANDEM_TORCH_THREADS)
    values["output_dir"] = str(settings.ARTIFACT_ROOT / "policies" / str(run.project_id) / f"bootstrap-run-{run.pk}")
    return bootstrap.config_class(**values)


def run_bootstrap(run: TrainingRun, recorder: RunRecorder) -> dict[str, Any]:
    bootstrap = bootstrap_for(run)
    config = bootstrap_config(run)
    if isinstance(config, ToolBootstrapConfig) and uses_shipped(config):
        recorder.log(f"copying the shipped policy (made with these settings) into {config.output_dir}")
    else:
        recorder.log(f"bootstrap SFT on {config.n_episodes} noisy demonstrations into {config.output_dir}")
    metrics = bootstrap.main(config, progress=recorder.progress)
    curve = metrics[bootstrap.loss_curve]
    for point_step, loss in enumerate(curve):
        recorder.metric(point_step * max(1, metrics["train_steps"] // len(curve)), loss=loss)
    name = run.config.get("policy_name") or f"bootstrap-{run.pk}"
    with transaction.atomic():
        TrainingRun.objects.filter(pk=run.pk).update(artifact_dir=config.output_dir)
        policy = PolicyVersion.objects.create(
            project=run.project,
            name=name,
            kind="local",
            weights_path=config.output_dir,
            produced_by=run,
            notes=bootstrap.notes,
        )
        for decoding in ("greedy", "sampled"):
            Evaluation.objects.create(
                project=run.project,
                policy_version=policy,
                run=run,
                name="heldout_success",
                decoding=decoding,
                value=metrics[f"{decoding}_success"],
                stderr=metrics[f"{decoding}_stderr"],
                n=metrics["eval_tasks"],
                details={"mean_length": metrics[f"{decoding}_{bootstrap.mean_length}"]},
            )
    recorder.log(
        f"registered {name}: held-out success {metrics['greedy_success']:.2f} greedy, "
        f"{metrics['sampled_success']:.2f} sampled, in {metrics['wall_seconds']:.0f} s"
    )
    summary = {k: v for k, v in metrics.items() if k not in (bootstrap.loss_curve, "config")}
    return {**summary, "policy_version": policy.pk, "config": asdict(config)}


def bootstrap_in_process(project: Project, config: dict[str, Any], *, created_by=None) -> TrainingRun:
    """Run a bootstrap here, not on a worker (the demo's first start has no worker yet). Returns the finished run;
    on success `run.summary["policy_version"]` is the new version's id."""
    bootstrap_config(TrainingRun(project=project, config=config))  # bad settings fail before a run row exists
    run = TrainingRun.objects.create(project=project, kind=RunKind.BOOTSTRAP, config=config, created_by=created_by)
    execute_run(run.pk, run_bootstrap)
    run.refresh_from_db()
    return run
