from __future__ import annotations

import pytest

from feedback_app.models import RunStatus, TrainingRun
from training.runs import RunCancelled, execute_run, request_cancel

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(project):
    return TrainingRun.objects.create(project=project, kind="evaluation")


def test_a_successful_body_records_summary_progress_metrics_and_log(run):
    def body(run, recorder):
        for step in range(1, 5):
            recorder.progress(step, 4, force=True)
            recorder.metric(step, loss=1.0 / step)
        recorder.log("all good")
        return {"answer": 42}

    assert execute_run(run.pk, body) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert run.summary == {"answer": 42}
    assert (run.progress_current, run.progress_total) == (4, 4)
    assert [point["loss"] for point in run.metrics] == [1.0, 0.5, 1 / 3, 0.25]
    assert "all good" in run.log


def test_a_crash_fails_the_run_and_keeps_the_traceback(run):
    def body(run, recorder):
        raise RuntimeError("the GPU caught fire")

    assert execute_run(run.pk, body) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.finished_at
    assert "RuntimeError: the GPU caught fire" in run.error and "Traceback" in run.error


def test_cancel_stops_a_running_body_at_its_next_progress_report(run):
    steps_done = []

    def body(run, recorder):
        recorder.check_interval = 0
        for step in range(100):
            if step == 3:
                request_cancel(TrainingRun.objects.get(pk=run.pk))
            recorder.progress(step, 100)
            steps_done.append(step)
        return {}

    assert execute_run(run.pk, body) == RunStatus.CANCELLED
    assert steps_done == [0, 1, 2]
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.cancel_requested


def test_a_queued_run_cancelled_before_it_starts_never_runs(run):
    assert request_cancel(run)
    calls = []
    assert execute_run(run.pk, lambda run, recorder: calls.append(1) or {}) is None
    assert calls == []
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert request_cancel(run) is False


def test_a_message_for_a_missing_run_is_dropped(db):
    assert execute_run(987654, lambda run, recorder: {}) is None


def test_run_cancelled_is_not_reported_as_a_failure(run):
    def body(run, recorder):
        raise RunCancelled()

    assert execute_run(run.pk, body) == RunStatus.CANCELLED
