"""The life of a TrainingRun inside a worker: claim it, report progress, honour cancel, record the outcome.

Every kind of background work (rollouts now; training and evaluation later) goes through `execute_run`, so a run
that is retried after a worker died, or delivered twice, does its work at most once to completion.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.utils import timezone

from feedback_app.models import RunStatus, TrainingRun
from reward_models.common.config import ConfigError

logger = logging.getLogger(__name__)

# Keep the log column bounded: a run that prints a line per step for days must not grow a row without limit.
MAX_LOG_CHARS = 200_000


class RunCancelled(Exception):
    """Raised inside a pipeline when the run's cancel flag is seen."""


class RunBusy(Exception):
    """The run is being executed by another live process; the message should come back later."""


def worker_identity() -> str:
    """``host:pid`` of this process, stored on the run it executes."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def owner_alive(run: TrainingRun) -> bool:
    """Whether the process that claimed a running `run` still executes it. On this host the process table says so
    (a worker child killed mid-run is dead at once, so its redelivered message takes the run over); on another host
    only the heartbeat can, and it must be fresher than TANDEM_RUN_STALE_SECONDS. A run claimed by this very process
    is not running any more: a process executes one run at a time."""
    if not run.worker:
        return False
    host, _, pid = run.worker.rpartition(":")
    if host == socket.gethostname():
        return pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid))
    if run.heartbeat_at is None:
        return False
    return (timezone.now() - run.heartbeat_at).total_seconds() < settings.TANDEM_RUN_STALE_SECONDS


class RunRecorder:
    """What a pipeline gets to report through. Progress writes are throttled; cancel is checked at most every
    `check_interval` seconds, so calling `progress()` every step costs almost nothing."""

    def __init__(self, run_id: int, *, write_interval: float = 0.5, check_interval: float = 0.5) -> None:
        self.run_id = run_id
        self.write_interval = write_interval
        self.check_interval = check_interval
        self._last_write = 0.0
        self._last_check = 0.0
        self._phase: str | None = None

    def progress(self, current: int, total: int, phase: str = "", *, force: bool = False) -> None:
        """`current` of `total` done in `phase` (training when empty); a new phase is written at once, with the time
        it began, so the run's ETA is the phase's own."""
        now = time.monotonic()
        new_phase = phase != self._phase
        if force or new_phase or current >= total or now - self._last_write >= self.write_interval:
            fields = {"progress_current": min(current, total), "progress_total": total, "progress_phase": phase}
            if new_phase:
                fields["phase_started_at"] = timezone.now()
                self._phase = phase
            TrainingRun.objects.filter(pk=self.run_id).update(**fields, heartbeat_at=timezone.now())
            self._last_write = now
        self.raise_if_cancelled()

    def metric(self, step: int, **values: float) -> None:
        run = TrainingRun.objects.only("metrics").get(pk=self.run_id)
        TrainingRun.objects.filter(pk=self.run_id).update(metrics=[*run.metrics, {"step": step, **values}])

    def log(self, line: str) -> None:
        logger.info("run %s: %s", self.run_id, line)
        stamped = f"{timezone.now():%H:%M:%S} {line}\n"
        TrainingRun.objects.filter(pk=self.run_id).update(log=Concat(F("log"), Value(stamped)))

    def cancel_requested(self) -> bool:
        return TrainingRun.objects.filter(pk=self.run_id, cancel_requested=True).exists()

    def raise_if_cancelled(self) -> None:
        now = time.monotonic()
        if now - self._last_check < self.check_interval:
            return
        self._last_check = now
        if self.cancel_requested():
            raise RunCancelled()


def execute_run(
    run_id: int,
    body: Callable[[TrainingRun, RunRecorder], dict[str, Any]],
    recorder_factory: Callable[[int], RunRecorder] | None = None,
) -> RunStatus | None:
    """Claim run `run_id`, run `body(run, recorder)` and store its outcome. Returns the final status, or None when
    the run had already finished (a duplicate delivery), in which case nothing is done.

    A run found `running` was claimed by a process that died (a killed worker's message is delivered again) or is
    still executing it elsewhere: the first is taken over (attempt n + 1; a pipeline resumes from its checkpoints),
    the second raises `RunBusy` so the task can come back later."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            # The row was deleted (or the message belongs to another database): there is nothing to run.
            logger.warning("run %s does not exist; dropping the message", run_id)
            return None
        if run.is_finished:
            logger.info("run %s is already %s; nothing to do", run_id, run.status)
            return None
        if run.cancel_requested:
            _finish(run, RunStatus.CANCELLED)
            return RunStatus.CANCELLED
        if run.status == RunStatus.RUNNING and owner_alive(run):
            raise RunBusy(f"run {run_id} is executing in {run.worker}")
        run.status = RunStatus.RUNNING
        run.started_at = run.started_at or timezone.now()
        run.attempts += 1
        run.worker = worker_identity()
        run.heartbeat_at = timezone.now()
        run.save(update_fields=["status", "started_at", "attempts", "worker", "heartbeat_at"])

    recorder = recorder_factory(run_id) if recorder_factory else RunRecorder(run_id)
    if run.attempts > 1:
        recorder.log(f"attempt {run.attempts}: taking the run up again")
    try:
        summary = body(run, recorder)
    except RunCancelled:
        recorder.log("cancelled")
        _finish(TrainingRun.objects.get(pk=run_id), RunStatus.CANCELLED)
        return RunStatus.CANCELLED
    except Exception as exc:  # noqa: BLE001 - any pipeline error fails the run, and the traceback is kept on it.
        logger.exception("run %s failed", run_id)
        run = TrainingRun.objects.get(pk=run_id)
        run.error = failure_text(exc)
        _finish(run, RunStatus.FAILED, extra_fields=["error"])
        return RunStatus.FAILED
    run = TrainingRun.objects.get(pk=run_id)
    run.summary = summary or {}
    if run.progress_total:
        run.progress_current = run.progress_total
    _finish(run, RunStatus.SUCCEEDED, extra_fields=["summary", "progress_current"])
    return RunStatus.SUCCEEDED


def failure_text(exc: BaseException) -> str:
    """What a failed run keeps: the reason in a line a person reads first (a bad setting's message as it is,
    ``data_path: 3 of 40 rows cannot be used: ...``, any other error with its type), then the traceback."""
    reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}".rstrip(": ")
    trace = "".join(traceback.format_exception(exc))
    return f"{reason[:2000]}\n\n{trace[-(MAX_LOG_CHARS - 2002) :]}"


def _finish(run: TrainingRun, status: RunStatus, extra_fields: list[str] | None = None) -> None:
    run.status = status
    run.finished_at = timezone.now()
    if len(run.log) > MAX_LOG_CHARS:
        run.log = run.log[-MAX_LOG_CHARS:]
    run.save(update_fields=["status", "finished_at", "log", *(extra_fields or [])])


def request_cancel(run: TrainingRun) -> bool:
    """Ask a run to stop. A queued run is cancelled at once; a running one stops at its next progress report.
    Returns False if the run had already finished."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if run.is_finished:
            return False
        run.cancel_requested = True
        if run.status == RunStatus.QUEUED:
            run.status = RunStatus.CANCELLED
            run.finished_at = timezone.now()
        run.save(update_fields=["cancel_requested", "status", "finished_at"])
    return True


def orphaned_runs() -> list[TrainingRun]:
    """Runs marked running whose executing process is gone (see `owner_alive`): their worker was killed, and with
    a broker that forgets a message once it is taken (the filesystem one) nobody would ever finish them."""
    running = TrainingRun.objects.filter(status=RunStatus.RUNNING, cancel_requested=False)
    return [run for run in running if not owner_alive(run)]
