"""Where a pipeline reports progress, metrics and log lines: the `Reporter` protocol, the console and silent
reporters, and the callback that connects a transformers `Trainer` to a reporter."""

from __future__ import annotations

import math
import sys
import time
from typing import Protocol


class Reporter(Protocol):
    """Where a pipeline reports. `progress` may raise (Tandem raises `RunCancelled` there when the run is cancelled),
    so a pipeline calls it at least once per optimiser step, and as often in any long stretch of work besides
    (evaluation, rollouts), and lets the exception through. `phase` names that other work ("evaluating the base
    policy: greedy"), which counts its own units; progress without one is training's."""

    def progress(self, current: int, total: int, phase: str = "") -> None: ...

    def metric(self, step: int, **values: float) -> None: ...

    def log(self, line: str) -> None: ...


class ConsoleReporter:
    """The command line's reporter: a progress line with an ETA every `interval` seconds, metrics and log lines on
    stderr."""

    def __init__(self, interval: float = 2.0, stream=None) -> None:
        self.interval = interval
        self.stream = stream or sys.stderr
        self._started = time.monotonic()
        self._last = 0.0

    def progress(self, current: int, total: int, phase: str = "") -> None:
        now = time.monotonic()
        if current < total and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self._started
        width = 30
        filled = int(width * current / total) if total else 0
        bar = "#" * filled + "." * (width - filled)
        if phase:
            print(f"{phase}: [{bar}] {current}/{total}", file=self.stream, flush=True)
            return
        eta = elapsed * (total - current) / current if current else float("nan")
        print(f"[{bar}] {current}/{total} elapsed {elapsed:.0f}s eta {eta:.0f}s", file=self.stream, flush=True)

    def metric(self, step: int, **values: float) -> None:
        shown = " ".join(f"{name}={value:.4g}" for name, value in values.items())
        print(f"step {step}: {shown}", file=self.stream, flush=True)

    def log(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class SilentReporter:
    """Reports nowhere; for library use and tests that do not watch progress."""

    def progress(self, current: int, total: int, phase: str = "") -> None:
        pass

    def metric(self, step: int, **values: float) -> None:
        pass

    def log(self, line: str) -> None:
        pass


def without_printer(trainer):
    """`trainer` (a TRL or HF `Trainer`) without transformers' `PrinterCallback`: the reporter shows progress and
    metrics, and the printer would put log dicts on stdout, where the command lines print their JSON summary."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def trainer_callback(reporter: Reporter):
    """A `transformers.TrainerCallback` that reports a TRL or HF `Trainer`'s progress after every optimiser step
    (so a cancel raised by the reporter stops training within one step) and its logged numbers as metrics."""
    from transformers import TrainerCallback

    class ReporterCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            reporter.progress(state.global_step, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            numbers = {
                name: float(value)
                for name, value in (logs or {}).items()
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            }
            if numbers:
                reporter.metric(state.global_step, **numbers)

    return ReporterCallback()
