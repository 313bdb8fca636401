"""A reporter for pipeline tests: it keeps what a pipeline reports and can raise from `progress`, as Tandem's run
reporter raises `RunCancelled` when a run is cancelled; and the cancel-stops-training, cancel-then-resume and
finished-directory checks every training pipeline's tests make with it; and one recorded run of a judge."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class RunCancelled(Exception):
    pass


class RecordingReporter:
    """Keeps what a pipeline reports: training's progress in `steps` (a repeat of the last one, as an online
    trainer's rollouts send after every turn, is counted in `calls` only), the other phases' progress in `phases`,
    metrics and log lines. Raises `error` once training's progress reaches `raise_at`, or at the first progress of
    a phase that starts with `raise_in`."""

    def __init__(self, raise_at: int | None = None, error: Exception | None = None, raise_in: str = "") -> None:
        self.steps: list[tuple[int, int]] = []
        self.calls = 0
        self.phases: list[tuple[str, int, int]] = []
        self.metrics: list[dict[str, float]] = []
        self.lines: list[str] = []
        self.raise_at, self.raise_in, self.error = raise_at, raise_in, error or RunCancelled()

    def progress(self, current: int, total: int, phase: str = "") -> None:
        if phase:
            self.phases.append((phase, current, total))
            if self.raise_in and phase.startswith(self.raise_in):
                raise self.error
            return
        self.calls += 1
        if not self.steps or self.steps[-1] != (current, total):
            self.steps.append((current, total))
        if self.raise_at is not None and current >= self.raise_at:
            raise self.error

    def metric(self, step: int, **values: float) -> None:
        self.metrics.append({"step": step, **values})

    def log(self, line: str) -> None:
        self.lines.append(line)

    def series(self, name: str) -> list[float]:
        return [values[name] for values in self.metrics if name in values]


def train_recorded(main: Callable, config_class: type, data_path, base_model, output_dir, **settings) -> tuple:
    """One run of a judge's `main` on `data_path` from `base_model` into `output_dir`, with `settings`, watched by a
    RecordingReporter: (config, summary, reporter)."""
    reporter = RecordingReporter()
    config = config_class(data_path=str(data_path), base_model=str(base_model), output_dir=str(output_dir), **settings)
    return config, main(config, reporter), reporter


def assert_cancel_stops_training(main: Callable[..., dict[str, Any]], config: Any, raise_at: int) -> None:
    """Runs the pipeline `main` on `config` with a reporter that cancels at training step `raise_at`, and checks
    that training stopped at that step without writing the artifact manifest into the output directory."""
    reporter = RecordingReporter(raise_at=raise_at)
    with pytest.raises(RunCancelled):
        main(config, reporter)
    assert [step for step, _ in reporter.steps] == list(range(1, raise_at + 1))
    assert not (Path(config.output_dir) / "tandem_artifact.json").exists()


def resumed_after_cancel(
    main: Callable[..., dict[str, Any]], config: Any, raise_at: int
) -> tuple[dict[str, Any], RecordingReporter]:
    """Runs the pipeline `main` on `config` until a cancel at training step `raise_at` (checking that it stops
    there), then again on the same directory: that second run's summary and reporter."""
    with pytest.raises(RunCancelled):
        main(config, RecordingReporter(raise_at=raise_at))
    reporter = RecordingReporter()
    return main(config, reporter), reporter


def assert_finished_returns_summary(
    main: Callable[..., dict[str, Any]], config: Any, summary: dict[str, Any]
) -> RecordingReporter:
    """Runs `main` on the finished directory of `config` and checks that it returns the stored `summary` (as JSON
    keeps it) without training a step; returns that run's reporter."""
    again = RecordingReporter()
    assert main(config, again) == json.loads(json.dumps(summary))
    assert again.steps == []
    return again
