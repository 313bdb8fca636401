from __future__ import annotations

import pytest

from feedback_app.models import RunStatus, TrainingRun
from training.runs import RunCancelled, RunRecorder, execute_run, request_cancel

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


def test_progress_in_a_phase_is_written_with_the_phase_and_when_it_began(run):
    seen = {}

    def body(run, recorder):
        recorder.progress(37, 200, "evaluating the base policy: greedy")
        seen["evaluating"] = TrainingRun.objects.get(pk=run.pk)
        recorder.progress(38, 200, "evaluating the base policy: greedy")  # the same phase: throttled, not rewritten
        seen["same"] = TrainingRun.objects.get(pk=run.pk)
        recorder.progress(1, 12)
        seen["training"] = TrainingRun.objects.get(pk=run.pk)
        return {}

    assert execute_run(run.pk, body) == RunStatus.SUCCEEDED
    evaluating, same, training = seen["evaluating"], seen["same"], seen["training"]
    assert (evaluating.progress_phase, evaluating.progress_current, evaluating.progress_total) == (
        "evaluating the base policy: greedy",
        37,
        200,
    )
    assert same.progress_current == 37 and same.phase_started_at == evaluating.phase_started_at
    assert (training.progress_phase, training.progress_current, training.progress_total) == ("", 1, 12)
    assert training.phase_started_at > evaluating.phase_started_at


def test_a_cancel_is_seen_within_a_phase_as_within_training(run):
    def body(run, recorder):
        recorder.progress(1, 200, "rolling out iteration 1 of 4")
        request_cancel(TrainingRun.objects.get(pk=run.pk))
        recorder.progress(2, 200, "rolling out iteration 1 of 4")
        raise AssertionError("the cancel was not seen")

    assert execute_run(run.pk, body, lambda pk: RunRecorder(pk, check_interval=0.0)) == RunStatus.CANCELLED
    run.refresh_from_db()
    assert run.progress_phase == "rolling out iteration 1 of 4" and run.progress_current == 1


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


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left_running(run: TrainingRun, worker: str, heartbeat_age_seconds: float = 0.0) -> None:
    from datetime import timedelta

    from django.utils import timezone

    heartbeat = timezone.now() - timedelta(seconds=heartbeat_age_seconds)
    TrainingRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, attempts=1, worker=worker, heartbeat_at=heartbeat
    )


def _take_over(run: TrainingRun) -> RunStatus | None:
    return execute_run(run.pk, lambda run, recorder: {"attempt": run.attempts})


def test_a_run_left_running_by_a_dead_process_on_this_host_is_taken_over(run):
    import socket

    from training.runs import orphaned_runs

    _left_running(run, f"{socket.gethostname()}:{_dead_pid()}")
    assert orphaned_runs() == [run]

    assert _take_over(run) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert run.summary == {"attempt": 2}
    assert "attempt 2: taking the run up again" in run.log
    assert orphaned_runs() == []


def test_a_run_executing_in_a_live_process_is_left_alone(run):
    import os
    import socket

    from training.runs import RunBusy, orphaned_runs

    _left_running(run, f"{socket.gethostname()}:{os.getppid()}")  # our parent is alive
    assert orphaned_runs() == []
    with pytest.raises(RunBusy):
        _take_over(run)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.attempts == 1


def test_a_run_on_another_host_is_taken_over_only_once_its_heartbeat_is_stale(run, settings):
    from training.runs import RunBusy

    settings.TANDEM_RUN_STALE_SECONDS = 60
    _left_running(run, "gpu-box-7:4242", heartbeat_age_seconds=10)
    with pytest.raises(RunBusy):
        _take_over(run)
    _left_running(run, "gpu-box-7:4242", heartbeat_age_seconds=120)
    assert _take_over(run) == RunStatus.SUCCEEDED
