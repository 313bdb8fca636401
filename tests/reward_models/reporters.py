"""A reporter for pipeline tests: it keeps what a pipeline reports and can raise from `progress`, as Tandem's run
reporter raises `RunCancelled` when a run is cancelled."""

from __future__ import annotations


class RunCancelled(Exception):
    pass


class RecordingReporter:
    """Keeps every progress call, metric and log line; raises `error` once progress reaches `raise_at`."""

    def __init__(self, raise_at: int | None = None, error: Exception | None = None) -> None:
        self.steps: list[tuple[int, int]] = []
        self.metrics: list[dict[str, float]] = []
        self.lines: list[str] = []
        self.raise_at, self.error = raise_at, error or RunCancelled()

    def progress(self, current: int, total: int) -> None:
        self.steps.append((current, total))
        if self.raise_at is not None and current >= self.raise_at:
            raise self.error

    def metric(self, step: int, **values: float) -> None:
        self.metrics.append({"step": step, **values})

    def log(self, line: str) -> None:
        self.lines.append(line)

    def series(self, name: str) -> list[float]:
        return [values[name] for values in self.metrics if name in values]
