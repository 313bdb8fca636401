"""Judge-model runs through Tandem: labels -> snapshot -> run -> registry, and the launch checks in front of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.imports import import_preference_stream
from feedback_app.models import Evaluation, RegisteredModel, RunStatus, TrainingRun
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows
from training.judges import create_judge_run, run_judge
from training.launch_checks import LaunchError
from training.runs import RunRecorder, execute_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]


QUICK = {"max_steps": 6, "batch_size": 4, "save_steps": 3, "logging_steps": 2, "eval_fraction": 0.25}


@pytest.fixture
def preference_snapshot(project, researcher):
    """A preference snapshot of oracle-labelled gridworld pairs, brought in through the preference import."""
    rows = preference_rows(scripted_episodes(8, per_task=3, seed=11))
    wanted = ("prompt", "chosen", "rejected")
    result = import_preference_stream(project, researcher, enumerate(({k: r[k] for k in wanted} for r in rows), 1))
    assert result.created + result.skipped_existing == len(rows) and result.created >= 15
    return create_snapshot(project, "preference", ExportFilters(), user=researcher, name="oracle pairs")


def _run_to_the_end(run: TrainingRun) -> TrainingRun:
    execute_run(run.pk, run_judge, lambda pk: RunRecorder(pk, check_interval=0.0))
    run.refresh_from_db()
    return run


def test_a_reward_model_run_trains_on_the_snapshot_and_registers_the_model(
    project, researcher, tiny_policy, preference_snapshot
):
    run = create_judge_run(
        project, "reward_model", snapshot=preference_snapshot, config={**QUICK, "name": "rm-v1"}, created_by=researcher
    )
    assert run.base_policy == tiny_policy and run.status == RunStatus.QUEUED

    run = _run_to_the_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.progress_current == run.progress_total == 6
    assert any("loss" in point for point in run.metrics)
    model = RegisteredModel.objects.get(run=run)
    assert (model.name, model.kind, model.snapshot, model.base_policy) == (
        "rm-v1",
        "reward_model",
        preference_snapshot,
        tiny_policy,
    )
    assert model.snapshot_hash == preference_snapshot.content_hash
    assert model.path == run.artifact_dir and Path(model.path, "tandem_artifact.json").is_file()
    assert not Path(model.path, "checkpoints").exists()
    assert "accuracy" in model.metrics
    figures = dict(Evaluation.objects.filter(run=run).values_list("name", "value"))
    assert figures["accuracy"] == model.metrics["accuracy"]
    assert run.summary["registered_model"] == model.pk

    from reward_models.reward.model import load_reward_model

    rows = preference_rows(scripted_episodes(2, per_task=2, seed=12))
    mean, _ = load_reward_model(model.path).score([rows[0]["prompt"]], [rows[0]["chosen"]])
    assert len(mean) == 1


def test_a_changed_snapshot_file_fails_the_run_before_training(project, tiny_policy, preference_snapshot):
    run = create_judge_run(project, "reward_model", snapshot=preference_snapshot, config=QUICK)
    with preference_snapshot.file.open("ab") as file:
        file.write(b'{"prompt": "tampered"}\n')

    run = _run_to_the_end(run)

    assert run.status == RunStatus.FAILED
    assert "no longer matches its hash" in run.error
    assert not RegisteredModel.objects.filter(run=run).exists()


def test_a_launch_names_each_bad_field_and_stores_nothing(project, tiny_policy, preference_snapshot, researcher):
    stepwise = create_snapshot(project, "stepwise", ExportFilters(), user=researcher, name="steps")
    bad_launches = [
        (dict(kind="dpo", snapshot=preference_snapshot), "kind"),
        (dict(kind="reward_model", snapshot=None), "snapshot"),
        (dict(kind="prm", snapshot=preference_snapshot), "snapshot"),
        (dict(kind="reward_model", snapshot=stepwise), "snapshot"),
        (dict(kind="reward_model", snapshot=preference_snapshot, config={"learning_rate": 5}), "config.learning_rate"),
        (dict(kind="reward_model", snapshot=preference_snapshot, config={"ties": "maybe"}), "config.ties"),
        (dict(kind="reward_model", snapshot=preference_snapshot, config={"lr": 0.1}), "config.lr"),
        (dict(kind="reward_model", snapshot=preference_snapshot, config={"output_dir": "/tmp"}), "config.output_dir"),
        (dict(kind="reward_model", snapshot=preference_snapshot, base_model="/no/such/dir"), "base_model"),
    ]
    for launch, field in bad_launches:
        kind = launch.pop("kind")
        with pytest.raises(LaunchError) as caught:
            create_judge_run(project, kind, **launch)
        assert field in caught.value.errors, (kind, launch, caught.value.errors)
    assert not TrainingRun.objects.filter(project=project).exists()


def test_a_value_critic_takes_only_judge_models_of_the_right_kind(project, tiny_policy, preference_snapshot):
    run = _run_to_the_end(create_judge_run(project, "reward_model", snapshot=preference_snapshot, config=QUICK))
    reward_model = RegisteredModel.objects.get(run=run)
    with pytest.raises(LaunchError) as caught:
        create_judge_run(project, "reward_model", snapshot=preference_snapshot, judges={"prm": reward_model})
    assert "judges.prm" in caught.value.errors
    with pytest.raises(LaunchError) as caught:
        create_judge_run(project, "value_critic", snapshot=preference_snapshot, judges={"prm": reward_model})
    assert caught.value.errors["judges.prm"] == "is a reward_model, not a prm"


class _CrashingRecorder(RunRecorder):
    """The run's recorder, but the machine 'fails' once training reaches `at_step`."""

    def __init__(self, run_id: int, at_step: int) -> None:
        super().__init__(run_id, check_interval=0.0)
        self.at_step = at_step

    def progress(self, current: int, total: int, phase: str = "", *, force: bool = False) -> None:
        super().progress(current, total, phase, force=force)
        if current >= self.at_step and not phase:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_crash_fails_the_run_with_its_traceback_and_keeps_the_last_good_checkpoint(
    project, tiny_policy, preference_snapshot
):
    from reward_models.common.artifacts import last_checkpoint
    from training.judges import run_output_dir

    run = create_judge_run(project, "reward_model", snapshot=preference_snapshot, config=QUICK)
    execute_run(run.pk, run_judge, lambda pk: _CrashingRecorder(pk, at_step=4))
    run.refresh_from_db()

    assert run.status == RunStatus.FAILED
    assert "illegal memory access" in run.error and "Traceback" in run.error
    assert last_checkpoint(run_output_dir(run)).endswith("checkpoint-3")
    assert not RegisteredModel.objects.filter(run=run).exists()


def test_every_judge_kind_names_a_pipeline_that_exists():
    from reward_models.common.judge_config import JudgeConfig
    from training.judges import PIPELINES

    assert set(PIPELINES) == {"reward_model", "prm", "value_critic", "generative_critic", "preference_model"}
    for kind, pipeline in PIPELINES.items():
        config_class, main = pipeline.config_class, pipeline.main
        assert issubclass(config_class, JudgeConfig) and callable(main), kind
        for setting in pipeline.judge_inputs or {}:
            assert setting in config_class.__dataclass_fields__, (kind, setting)
