"""A run's snapshot, checked against its trainer when the run is launched rather than when a worker loads it.

Each trainer module exposes its own row check, ``row_problems(rows, config)`` (row number -> reason), and runs it
itself when it loads its data; a launch runs the same function on the snapshot's file, so a snapshot the trainer
would refuse is a 400 that names the rows and why, not a run that fails seconds after it starts. When the row format
changes, the trainer's check changes with it and the launch follows. A worker that takes the run up checks the file
once more, against the hash stored when the snapshot was made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedback_app.models import DatasetSnapshot
from reward_models.common.config import ConfigError
from reward_models.common.data import read_rows, rows_error

RowProblems = Callable[[Sequence[dict[str, Any]], Any], Mapping[int, str]]


def snapshot_rows(snapshot: DatasetSnapshot) -> list[dict[str, Any]]:
    """Every row of the snapshot's file."""
    return read_rows(snapshot.file)


def row_errors(snapshot: DatasetSnapshot, rows: Sequence[dict[str, Any]], row_problems: RowProblems, config) -> str:
    """Why the trainer (its `row_problems`, with the run's `config`) would refuse `rows`; "" when it would not."""
    if not rows:
        return f"{snapshot.name!r} holds no rows"
    problems = row_problems(rows, config)
    if not problems:
        return ""
    return (
        f"{rows_error(problems, len(rows)).reason}. Make a snapshot without them: its filters can keep only some "
        "trajectory sources (policy, human, import) or policy versions."
    )


def checked_rows(
    snapshot: DatasetSnapshot, row_problems: RowProblems, config, errors: dict[str, str]
) -> list[dict[str, Any]] | None:
    """The snapshot's rows, or None with the reason they are refused under ``snapshot`` in `errors`: the file cannot
    be read, or the trainer's own `row_problems` (with the run's `config`) would refuse them."""
    try:
        rows = snapshot_rows(snapshot)
    except ConfigError as exc:
        errors["snapshot"] = read_error(exc)
        return None
    if problem := row_errors(snapshot, rows, row_problems, config):
        errors["snapshot"] = problem
        return None
    return rows


def check_unchanged(snapshot: DatasetSnapshot) -> None:
    """Refuse (RuntimeError) to train on a snapshot whose file no longer matches the hash stored with it."""
    if not snapshot.verify():
        raise RuntimeError(
            f"snapshot {snapshot.name!r}: the file {snapshot.file} no longer matches its hash "
            f"{snapshot.content_hash[:12]}; refusing to train on changed data"
        )


def small_data_warning(used: int, batch_size: int, what: str, detail: str = "") -> str:
    """A warning when a run would train on less than one batch of `what` (pairs, rows): it would make one optimiser
    step per epoch and leave the policy much as it was. "" when the data fill a batch."""
    if used >= batch_size:
        return ""
    return (
        f"Only {used} {what} for a batch of {batch_size}{f' ({detail})' if detail else ''}: training would hardly "
        "change the policy. Make a larger snapshot or change the settings, or confirm to launch it anyway."
    )


def read_error(exc: ConfigError) -> str:
    """A snapshot file that cannot be read at all (missing, not JSON), as the launch reports it."""
    return f"its file cannot be read: {exc.reason}"
