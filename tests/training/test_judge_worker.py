"""A reward-model run on real Celery worker processes: the worker is killed mid-training, a new one takes the run up
again from its last checkpoint, and a cancel reaches a running trainer."""

from __future__ import annotations

import os
import signal
import time

import pytest

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.imports import import_preference_stream
from feedback_app.models import RegisteredModel, RunStatus, TrainingRun
from reward_models.common.artifacts import last_checkpoint
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows
from training import tasks
from training.judges import create_judge_run, run_output_dir
from training.runs import request_cancel

pytestmark = pytest.mark.worker

SLOW_ENOUGH_TO_KILL = {"max_steps": 40, "batch_size": 2, "save_steps": 4, "logging_steps": 2, "eval_fraction": 0.2}


@pytest.fixture
def artifact_env(settings, tmp_path):
    """The test's artifact root, for this process and the workers alike."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    return {"ARTIFACT_ROOT": str(settings.ARTIFACT_ROOT)}


@pytest.fixture
def snapshot(project, researcher):
    rows = preference_rows(scripted_episodes(8, per_task=3, seed=21))
    import_preference_stream(
        project, researcher, enumerate(({k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows), 1)
    )
    return create_snapshot(project, "preference", ExportFilters(), user=researcher, name="pairs")


def _wait(run: TrainingRun, condition, what: str, timeout: float = 240) -> TrainingRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if condition(run):
            return run
        time.sleep(0.2)
    raise AssertionError(
        f"run {run.pk} never {what} within {timeout} s: {run.status}, {run.progress_current}\n{run.log}"
    )


def test_a_killed_worker_s_run_resumes_from_its_last_checkpoint_on_the_next_worker(
    celery_workers, artifact_env, project, tiny_policy, snapshot
):
    run = create_judge_run(project, "reward_model", snapshot=snapshot, config=SLOW_ENOUGH_TO_KILL)
    first = celery_workers(extra_env=artifact_env)
    tasks.train_judge.delay(run.pk)
    output_dir = run_output_dir(run)
    run = _wait(run, lambda r: last_checkpoint(output_dir) is not None, "wrote a checkpoint")

    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.attempts == 1
    checkpoint_step = int(last_checkpoint(output_dir).rsplit("-", 1)[1])
    assert 0 < checkpoint_step < SLOW_ENOUGH_TO_KILL["max_steps"]

    second = celery_workers(purge=False, extra_env=artifact_env)
    run = _wait(run, lambda r: r.is_finished, "finished")

    log = second.log_path.read_text()
    assert run.status == RunStatus.SUCCEEDED, f"{run.error}\n--- worker log ---\n{log}"
    assert run.attempts == 2 and "taking the run up again" in run.log
    resumed_from = run.summary["resumed_from"]
    assert resumed_from and int(str(resumed_from).rsplit("-", 1)[1]) >= checkpoint_step
    assert run.progress_current == SLOW_ENOUGH_TO_KILL["max_steps"]
    assert RegisteredModel.objects.filter(run=run).exists()


def test_a_cancel_stops_a_training_run_on_a_worker(celery_workers, artifact_env, project, tiny_policy, snapshot):
    config = {**SLOW_ENOUGH_TO_KILL, "max_steps": 400, "save_steps": 1000}
    run = create_judge_run(project, "reward_model", snapshot=snapshot, config=config)
    celery_workers(extra_env=artifact_env)
    tasks.train_judge.delay(run.pk)
    run = _wait(run, lambda r: r.progress_current >= 2, "made progress")

    assert request_cancel(run)
    run = _wait(run, lambda r: r.is_finished, "stopped", timeout=60)

    assert run.status == RunStatus.CANCELLED
    assert run.progress_current < config["max_steps"]
    assert not RegisteredModel.objects.filter(run=run).exists()
