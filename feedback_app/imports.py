"""Importing external trajectories: every row is validated first, then all rows are written in one transaction.

A file with any bad row is rejected whole, with each bad row's number, field and reason, so an import never leaves
half a file behind. `external_id` makes a retried import idempotent: rows already stored are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from django.db import transaction

from feedback_app.models import PolicyVersion, Project, Step, Task, Trajectory
from feedback_app.models.trajectories import PolicyKind
from feedback_app.serializers import TrajectoryImportSerializer

MAX_REPORTED_ERRORS = 100


@dataclass
class RowError:
    row: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.field}: {self.reason}"


class ImportRejected(Exception):
    def __init__(self, errors: list[RowError], total_bad: int) -> None:
        self.errors = errors
        self.total_bad = total_bad
        shown = "\n".join(str(error) for error in errors)
        more = f"\n… and {total_bad - len(errors)} more bad rows" if total_bad > len(errors) else ""
        super().__init__(f"{total_bad} bad row(s); nothing was imported.\n{shown}{more}")


@dataclass
class ImportResult:
    created: int = 0
    skipped_existing: int = 0
    trajectory_ids: list[int] = field(default_factory=list)


def iter_json_rows(stream: IO[bytes] | IO[str]) -> Iterator[tuple[int, Any]]:
    """Yield (row number, parsed object) from JSONL, or from a single JSON array. Row numbers start at 1; a line
    that does not parse yields a RowError in place of the object."""
    first = stream.read(1)
    if isinstance(first, bytes):
        first = first.decode()
    while first and first.isspace():
        first = stream.read(1)
        first = first.decode() if isinstance(first, bytes) else first
    if first == "[":
        rest = stream.read()
        rest = rest.decode() if isinstance(rest, bytes) else rest
        try:
            rows = json.loads("[" + rest)
        except json.JSONDecodeError as exc:
            yield 1, RowError(1, "(body)", f"malformed JSON array: {exc.msg} at line {exc.lineno}")
            return
        yield from enumerate(rows, start=1)
        return
    for number, line in enumerate(_lines(first, stream), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, RowError(number, "(line)", f"malformed JSON: {exc.msg} at column {exc.colno}")


def _lines(first: str, stream: IO) -> Iterator[str]:
    head = first
    for raw in stream:
        line = raw.decode() if isinstance(raw, bytes) else raw
        yield head + line
        head = ""
    if head:
        yield head


def validate_rows(rows: Iterable[tuple[int, Any]]) -> list[dict]:
    """Validate every row; raise ImportRejected listing the first MAX_REPORTED_ERRORS problems if any is bad."""
    valid: list[dict] = []
    errors: list[RowError] = []
    bad_rows = 0
    seen: dict[str, int] = {}
    for number, obj in rows:
        if isinstance(obj, RowError):
            bad_rows += 1
            errors.append(obj)
            continue
        if not isinstance(obj, dict):
            bad_rows += 1
            errors.append(RowError(number, "(row)", f"expected a JSON object, got {type(obj).__name__}"))
            continue
        serializer = TrajectoryImportSerializer(data=obj)
        if not serializer.is_valid():
            bad_rows += 1
            errors.extend(RowError(number, path, reason) for path, reason in _flatten(serializer.errors))
            continue
        data = serializer.validated_data
        if data["external_id"] in seen:
            bad_rows += 1
            errors.append(
                RowError(number, "external_id", f"repeats row {seen[data['external_id']]}'s {data['external_id']!r}")
            )
            continue
        seen[data["external_id"]] = number
        valid.append(data)
    if bad_rows:
        raise ImportRejected(errors[:MAX_REPORTED_ERRORS], bad_rows)
    return valid


def _flatten(errors: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(errors, dict):
        for key, value in errors.items():
            if isinstance(key, int):  # DRF reports list items as {index: errors}
                name = f"{prefix}[{key}]"
            elif key == "non_field_errors":
                name = prefix
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            yield from _flatten(value, name or "(row)")
    elif isinstance(errors, list) and errors and all(isinstance(item, str) for item in errors):
        for message in errors:
            yield prefix or "(row)", str(message)
    elif isinstance(errors, list):
        for index, value in enumerate(errors):
            if value:
                yield from _flatten(value, f"{prefix}[{index}]")
    else:
        yield prefix or "(row)", str(errors)


def import_trajectories(project: Project, rows: list[dict]) -> ImportResult:
    """Write validated rows (from `validate_rows`) atomically. Rows whose external_id exists are skipped."""
    result = ImportResult()
    with transaction.atomic():
        existing = set(
            Trajectory.objects.filter(project=project, external_id__in=[r["external_id"] for r in rows]).values_list(
                "external_id", flat=True
            )
        )
        new_rows = [row for row in rows if row["external_id"] not in existing]
        result.skipped_existing = len(rows) - len(new_rows)
        if not new_rows:
            return result
        tasks = _resolve_tasks(project, new_rows)
        policies = _resolve_policies(project, new_rows)
        trajectories = []
        for row, task in zip(new_rows, tasks, strict=True):
            outcome = row.get("outcome") or {}
            trajectories.append(
                Trajectory(
                    project=project,
                    task=task,
                    policy_version=policies.get(row.get("policy")),
                    source=row["source"],
                    external_id=row["external_id"],
                    num_steps=len(row["steps"]),
                    total_env_reward=sum(step["reward"] for step in row["steps"]),
                    success=outcome.get("success"),
                    outcome_return=outcome.get("outcome_return"),
                    metadata=row["metadata"],
                )
            )
        Trajectory.objects.bulk_create(trajectories, batch_size=1000)
        steps = [
            Step(
                trajectory=trajectory,
                index=index,
                observation=step["observation"],
                reasoning=step["reasoning"],
                action=step["action"],
                tool_calls=[dict(call) for call in step["tool_calls"]],
                env_reward=step["reward"],
                logprob=step["logprob"],
                media=[dict(item) for item in step["media"]],
                done=step["done"] or index == len(row["steps"]) - 1,
            )
            for row, trajectory in zip(new_rows, trajectories, strict=True)
            for index, step in enumerate(row["steps"])
        ]
        Step.objects.bulk_create(steps, batch_size=2000)
    result.created = len(trajectories)
    result.trajectory_ids = [t.pk for t in trajectories]
    return result


def _resolve_tasks(project: Project, rows: list[dict]) -> list[Task]:
    """Find or make each row's task: by external_id, else by seed, else one new task per distinct instruction."""

    def key(ref: dict) -> tuple:
        if ref.get("external_id"):
            return ("external_id", ref["external_id"])
        if ref.get("seed") is not None:
            return ("seed", ref["seed"])
        return ("instruction", ref["instruction"])

    keys = [key(row["task"]) for row in rows]
    found: dict[tuple, Task] = {}
    by_ext = [k[1] for k in keys if k[0] == "external_id"]
    by_seed = [k[1] for k in keys if k[0] == "seed"]
    for task in Task.objects.filter(project=project, external_id__in=by_ext):
        found[("external_id", task.external_id)] = task
    for task in Task.objects.filter(project=project, seed__in=by_seed):
        found[("seed", task.seed)] = task
    missing: dict[tuple, Task] = {}
    for k, row in zip(keys, rows, strict=True):
        if k in found or k in missing:
            continue
        ref = row["task"]
        missing[k] = Task(
            project=project,
            instruction=ref.get("instruction", ""),
            seed=ref.get("seed"),
            external_id=ref.get("external_id"),
            spec=ref.get("spec") or ({"seed": ref["seed"]} if ref.get("seed") is not None else {}),
        )
    Task.objects.bulk_create(missing.values(), batch_size=1000)
    found.update(missing)
    return [found[k] for k in keys]


def _resolve_policies(project: Project, rows: list[dict]) -> dict[str, PolicyVersion]:
    names = {row["policy"] for row in rows if row.get("policy")}
    policies = {p.name: p for p in PolicyVersion.objects.filter(project=project, name__in=names)}
    for name in names - set(policies):
        policies[name] = PolicyVersion.objects.create(project=project, name=name, kind=PolicyKind.EXTERNAL)
    return policies
