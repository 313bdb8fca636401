"""End to end: a real Celery worker process takes a rollout run from the broker and writes to the database."""

from __future__ import annotations

import time

import pytest

from feedback_app.models import RunStatus, TrainingRun, Trajectory
from training import tasks
from training.rollouts import RolloutConfig, create_rollout_run

pytestmark = pytest.mark.worker


def _wait_for_finish(run: TrainingRun, timeout: float = 180) -> TrainingRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_finished:
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run.pk} still {run.status} after {timeout} s")


def test_a_rollout_enqueued_on_the_broker_lands_in_the_database(
    celery_worker_process, project, tiny_policy, review_tasks
):
    run = create_rollout_run(project, tiny_policy, RolloutConfig(num_tasks=3, samples_per_task=2))
    tasks.rollout.delay(run.pk)

    run = _wait_for_finish(run)

    log = celery_worker_process.log_path.read_text()
    assert run.status == RunStatus.SUCCEEDED, f"{run.error}\n--- worker log ---\n{log}"
    assert Trajectory.objects.filter(rollout_run=run).count() == 6
    assert "training.rollout" in log
