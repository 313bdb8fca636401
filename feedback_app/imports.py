"""Importing external trajectories and preference labels, streamed and atomic.

Rows are read from a JSON Lines stream (or a JSON array), validated in batches and written in batches inside one
transaction, so memory stays flat however long the file is. The first bad row stops the writing; the rest of the
file is still validated so the caller learns about every bad row (the first MAX_REPORTED_ERRORS are listed), and
then the transaction rolls back: an import never leaves half a file behind. `external_id` makes a retried import
idempotent: rows already stored are skipped.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import IO, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from feedback_app.models import Comparison, PolicyVersion, Project, Step, Task, Trajectory
from feedback_app.models.trajectories import PolicyKind, TrajectorySource
from feedback_app.serializers import (
    PreferenceImportSerializer,
    TrajectoryImportSerializer,
    trajectory_size_problem,
    turns_for_steps,
)
from feedback_app.text_checks import json_problem

MAX_REPORTED_ERRORS = 100
CHUNK_BYTES = 1 << 20
# Rows are validated and written this many at a time: big enough for bulk inserts, small enough for flat memory.
BATCH_ROWS = 500
# In a JSON array a row is only known to be malformed, rather than cut by a chunk boundary, once this much of it has
# been read. JSON Lines has no such limit.
MAX_ARRAY_ROW_BYTES = 16 << 20


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


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"The body is larger than the {limit} bytes an import may have.")


@dataclass
class ImportResult:
    created: int = 0
    skipped_existing: int = 0
    trajectory_ids: list[int] = field(default_factory=list)


# --- Reading ------------------------------------------------------------------------------------------------------


def read_chunks(stream: IO[bytes] | IO[str], limit: int | None = None) -> Iterator[bytes]:
    """Yield the stream's bytes in chunks; raise BodyTooLarge as soon as more than `limit` bytes were read."""
    total = 0
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode()
        total += len(chunk)
        if limit is not None and total > limit:
            raise BodyTooLarge(limit)
        yield chunk


def iter_json_rows(stream: IO[bytes] | IO[str], *, limit: int | None = None) -> Iterator[tuple[int, Any]]:
    """Yield (row number, parsed object) from JSON Lines, or from one JSON array. A row that does not parse
    yields a RowError in place of the object.

    For JSON Lines the row number is the line number (blank lines are skipped but counted), and every malformed
    line is reported. In an array the row number is the element's position; a malformed array cannot be read past
    the first error, which names its line.
    """
    chunks = read_chunks(stream, limit)
    head = b""
    for chunk in chunks:
        head += chunk
        if head.lstrip(b"\xef\xbb\xbf \t\r\n"):
            break
    head = head.removeprefix(b"\xef\xbb\xbf")
    if head.lstrip()[:1] == b"[":
        yield from _ArrayRows(head, chunks)
    else:
        yield from _line_rows(head, chunks)


def _line_rows(head: bytes, chunks: Iterator[bytes]) -> Iterator[tuple[int, Any]]:
    number = 0
    pending = b""
    for chunk in chain([head], chunks):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            number += 1
            yield from _parse_line(number, line)
    if pending:
        yield from _parse_line(number + 1, pending)


def _parse_line(number: int, line: bytes) -> Iterator[tuple[int, Any]]:
    if not line.strip():
        return
    try:
        yield number, json.loads(line, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        yield number, RowError(number, "(line)", f"malformed JSON on line {number}: {exc.msg} at column {exc.colno}")
    except ValueError as exc:  # not UTF-8, or NaN / Infinity
        yield number, RowError(number, "(line)", f"malformed JSON on line {number}: {exc}")
    except RecursionError:
        yield number, RowError(number, "(line)", f"line {number} is nested too deeply")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (use null)")


_SPACE = re.compile(r"[ \t\r\n]*")


class _ArrayRows:
    """Yield the elements of a top-level JSON array one at a time, reading chunk by chunk."""

    def __init__(self, head: bytes, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.decode = codecs.getincrementaldecoder("utf-8")(errors="strict").decode
        self.decoder = json.JSONDecoder(parse_constant=_reject_constant)
        self.buf = ""
        self.pos = 0
        self.line = 1  # line number of buf[0]
        self.eof = False
        self.first = head

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        try:
            self.buf = self.decode(self.first)
            yield from self._elements()
        except UnicodeDecodeError as exc:
            yield 1, RowError(1, "(body)", f"the body is not UTF-8 text: {exc.reason}")

    def _elements(self) -> Iterator[tuple[int, Any]]:
        self._next_char()  # the opening bracket
        self.pos += 1
        if self._next_char() == "]":
            self.pos += 1
            yield from self._trailing(0)
            return
        index = 0
        while True:
            index += 1
            value = self._value(index)
            yield index, value
            if isinstance(value, RowError):
                return
            char = self._next_char()
            if char == ",":
                self.pos += 1
            elif char == "]":
                self.pos += 1
                yield from self._trailing(index)
                return
            else:
                yield index + 1, self._error(index + 1, "expected ',' or ']' after the element", self.pos)
                return

    def _trailing(self, index: int) -> Iterator[tuple[int, Any]]:
        if self._next_char():
            yield index + 1, self._error(index + 1, "unexpected text after the closing ']'", self.pos)

    def _value(self, index: int) -> Any:
        while True:
            self._next_char()
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # Maybe the element is only cut by the end of the chunk: read on, up to a limit.
                if not self.eof and len(self.buf) - self.pos < MAX_ARRAY_ROW_BYTES and self._more():
                    continue
                return self._error(index, exc.msg, exc.pos)
            except ValueError as exc:
                return self._error(index, str(exc), self.pos)
            except RecursionError:
                return self._error(index, "the element is nested too deeply", self.pos)
            if end == len(self.buf) and not self.eof and self._more():
                continue  # a number at the very end may go on in the next chunk
            self.pos = end
            return value

    def _next_char(self) -> str:
        """Skip whitespace and return the next character ("" at the end of the body)."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def _more(self) -> bool:
        """Append the next chunk, dropping what was consumed; False (positions unchanged) at the end."""
        if self.eof:
            return False
        chunk = next(self.chunks, None)
        if chunk is None:
            self.eof = True
            self.buf += self.decode(b"", final=True)
            return False
        self.line += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos :] + self.decode(chunk)
        self.pos = 0
        return True

    def _error(self, index: int, message: str, at: int) -> RowError:
        line = self.line + self.buf.count("\n", 0, at)
        return RowError(index, "(line)", f"malformed JSON on line {line}: {message}")


# --- Validating and storing ---------------------------------------------------------------------------------------


class _RowKind:
    """How one kind of row is validated and stored; `import_rows` drives it batch by batch."""

    serializer_class: type

    def __init__(self, project: Project) -> None:
        self.project = project
        self.seen: dict[str, int] = {}

    def validate(self, batch: list[tuple[int, Any]]) -> tuple[list[dict], list[RowError], int]:
        """Return (valid rows, errors, number of bad rows) for one batch."""
        checked: list[tuple[int, Any, dict | None, list[RowError]]] = []  # (row, object, data, errors)
        unsure: list[int] = []  # positions in `checked` that the serializer must decide
        for number, obj in batch:
            if isinstance(obj, RowError):
                checked.append((number, obj, None, [obj]))
            elif not isinstance(obj, dict):
                checked.append(
                    (number, obj, None, [RowError(number, "(row)", f"expected a JSON object, got {_json_type(obj)}")])
                )
            elif problem := json_problem(obj):
                checked.append((number, obj, None, [RowError(number, problem[0], problem[1])]))
            else:
                data = self.fast(obj)
                if data is None:
                    unsure.append(len(checked))
                checked.append((number, obj, data, []))
        if unsure:
            # One list serializer per batch: DRF builds the nested fields once instead of once per row.
            objects = [checked[position][1] for position in unsure]
            serializer = self.serializer_class(data=objects, many=True, context=self.context())
            if serializer.is_valid():
                for position, data in zip(unsure, serializer.validated_data, strict=True):
                    number, obj, _, _ = checked[position]
                    checked[position] = (number, obj, data, [])
            else:
                # DRF reports a list serializer's errors as a list, or as {index: errors} with
                # LIST_SERIALIZER_ERRORS_AS_DICT (its default from 3.20 on). Valid rows of a bad batch are not
                # stored, so they keep data None and are only checked across rows.
                errors = serializer.errors
                by_index = errors if isinstance(errors, dict) else dict(enumerate(errors))
                for index, position in enumerate(unsure):
                    number, obj, _, _ = checked[position]
                    found = [RowError(number, path, reason) for path, reason in _flatten(by_index.get(index) or {})]
                    checked[position] = (number, obj, None, found)
        valid, errors, bad = [], [], 0
        for number, obj, data, found in checked:
            if isinstance(obj, dict):
                repeat = self.check(number, obj if data is None else data)
                if repeat is not None and not found:
                    found = [repeat]
            if found:
                bad += 1
                errors.extend(found)
            elif data is not None:
                valid.append(data)
        return valid, errors, bad

    def fast(self, obj: dict) -> dict | None:
        """Validated data for rows simple enough to check without the serializer; None lets it decide."""
        return None

    def context(self) -> dict:
        return {}

    def check(self, number: int, row: dict) -> RowError | None:
        """Checks across rows (a repeated external_id); `row` is validated data, or the raw object."""
        external_id = row.get("external_id")
        if not isinstance(external_id, str):
            return None
        if external_id in self.seen:
            return RowError(number, "external_id", f"repeats row {self.seen[external_id]}'s {external_id!r}")
        self.seen[external_id] = number
        return None

    def store(self, rows: list[dict], result: ImportResult) -> None:
        raise NotImplementedError


def import_rows(kind: _RowKind, rows: Iterable[tuple[int, Any]]) -> ImportResult:
    """Validate and store `rows` batch by batch in one transaction; raise ImportRejected (and roll back) if any
    row is bad. BodyTooLarge from the reader also rolls back."""
    result = ImportResult()
    errors: list[RowError] = []
    bad = 0
    iterator = iter(rows)
    with transaction.atomic():
        while batch := list(islice(iterator, BATCH_ROWS)):
            valid, batch_errors, batch_bad = kind.validate(batch)
            bad += batch_bad
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.extend(batch_errors[: MAX_REPORTED_ERRORS - len(errors)])
            if not bad and valid:
                kind.store(valid, result)
        if bad:
            raise ImportRejected(errors, bad)
    return result


# --- The fast path for trajectory rows -------------------------------------------------------------------------
#
# DRF validates a five-step row in about 2 ms, which makes it most of the cost of a large import. Most rows are plain:
# exact JSON types, no surrounding whitespace, no media. `plain_trajectory_row` accepts exactly those and returns what
# TrajectoryImportSerializer would; for anything else it returns None and the serializer decides (and words the
# errors). The serializer stays the definition of the schema; tests check the two agree.

_ODD_CHARACTERS = re.compile("[\x00\ud800-\udfff]")  # DRF refuses null characters and lone surrogates


def _text(value: Any, *, blank: bool, trim: bool, max_length: int | None = None) -> bool:
    if type(value) is not str or (not blank and value == "") or (trim and value != value.strip()):
        return False
    if max_length is not None and len(value) > max_length:
        return False
    return "\x00" not in value if value.isascii() else not _ODD_CHARACTERS.search(value)


def _number(value: Any) -> bool:
    return (type(value) is float and math.isfinite(value)) or (type(value) is int and abs(value) < 2**53)


def _plain_tool_call(call: Any) -> dict | None:
    if type(call) is not dict or not call.keys() <= {"id", "type", "name", "arguments", "function"}:
        return None
    out: dict[str, Any] = {}
    if "id" in call:
        if not _text(call["id"], blank=True, trim=True):
            return None
        out["id"] = call["id"]
    out["type"] = call.get("type", "function")
    if not _text(out["type"], blank=False, trim=True):
        return None
    if "name" in call:
        if not _text(call["name"], blank=False, trim=True):
            return None
        out["name"] = call["name"]
    out["arguments"] = call.get("arguments", {})
    if out["arguments"] is None:
        return None
    if "function" in call:
        function = call["function"]
        if type(function) is not dict or "name" not in function:
            return None
        out.setdefault("name", function["name"])
        out["arguments"] = function.get("arguments", out["arguments"])
    if not out.get("name"):
        return None
    return out


def _plain_step(step: Any) -> dict | None:
    if type(step) is not dict or step.get("media"):
        return None
    out: dict[str, Any] = {}
    for name in ("observation", "reasoning", "action"):
        value = step.get(name, "")
        if not _text(value, blank=True, trim=False):
            return None
        out[name] = value
    calls = step.get("tool_calls", [])
    if type(calls) is not list:
        return None
    out["tool_calls"] = []
    for call in calls:
        plain = _plain_tool_call(call)
        if plain is None:
            return None
        out["tool_calls"].append(plain)
    reward, logprob, done = step.get("reward", 0.0), step.get("logprob"), step.get("done", False)
    if not _number(reward) or not (logprob is None or _number(logprob)) or type(done) is not bool:
        return None
    if not out["action"] and not out["tool_calls"]:
        return None
    out.update(reward=float(reward), logprob=None if logprob is None else float(logprob), media=[], done=done)
    return out


def plain_trajectory_row(row: dict) -> dict | None:
    """TrajectoryImportSerializer's validated data for a plain step-based row, or None to let it decide."""
    if "messages" in row:
        return None
    external_id, task, steps = row.get("external_id"), row.get("task"), row.get("steps")
    if not _text(external_id, blank=False, trim=True, max_length=255) or type(task) is not dict:
        return None
    if type(steps) is not list or not steps or len(steps) > settings.TANDEM_MAX_TRAJECTORY_STEPS:
        return None
    out_task: dict[str, Any] = {}
    if "external_id" in task:
        if not _text(task["external_id"], blank=False, trim=True, max_length=255):
            return None
        out_task["external_id"] = task["external_id"]
    if "seed" in task:
        if not (task["seed"] is None or type(task["seed"]) is int):
            return None
        out_task["seed"] = task["seed"]
    out_task["instruction"] = task.get("instruction", "")
    if not _text(out_task["instruction"], blank=True, trim=True):
        return None
    out_task["spec"] = task.get("spec", {})
    if type(out_task["spec"]) is not dict:
        return None
    out_task["spec"] = dict(out_task["spec"])
    if not out_task.get("external_id") and out_task.get("seed") is None and not out_task["instruction"]:
        return None
    out: dict[str, Any] = {"external_id": external_id, "task": out_task}
    if "policy" in row:
        if not _text(row["policy"], blank=False, trim=True, max_length=120):
            return None
        out["policy"] = row["policy"]
    out["source"] = row.get("source", "import")
    if out["source"] not in ("import", "human"):
        return None
    out["steps"] = []
    for step in steps:
        plain = _plain_step(step)
        if plain is None:
            return None
        out["steps"].append(plain)
    if "outcome" in row:
        outcome = row["outcome"]
        if type(outcome) is not dict:
            return None
        success, outcome_return = outcome.get("success"), outcome.get("return")
        if not (success is None or type(success) is bool) or not (outcome_return is None or _number(outcome_return)):
            return None
        out["outcome"] = {
            "success": success,
            "outcome_return": None if outcome_return is None else float(outcome_return),
        }
    metadata = row.get("metadata", {})
    if type(metadata) is not dict:
        return None
    out["metadata"] = dict(metadata)
    if "tools" in row:
        return None  # the serializer checks them
    out["tools"] = []
    if trajectory_size_problem(out["steps"]):
        return None  # the serializer words the error
    out["prompt"] = turns_for_steps(out["task"]["instruction"], out["steps"])
    return out


class TrajectoryRows(_RowKind):
    serializer_class = TrajectoryImportSerializer

    def fast(self, obj: dict) -> dict | None:
        return plain_trajectory_row(obj)

    def __init__(self, project: Project) -> None:
        super().__init__(project)
        self.policies: dict[str, PolicyVersion] = {}

    def store(self, rows: list[dict], result: ImportResult) -> None:
        existing = set(
            Trajectory.objects.filter(project=self.project, external_id__in=[r["external_id"] for r in rows])
            .values_list("external_id", flat=True)
            .order_by()
        )
        new_rows = [row for row in rows if row["external_id"] not in existing]
        result.skipped_existing += len(rows) - len(new_rows)
        if not new_rows:
            return
        tasks = _resolve_tasks(self.project, [row["task"] for row in new_rows])
        self._resolve_policies(new_rows)
        trajectories = [
            Trajectory(
                project=self.project,
                task=task,
                policy_version=self.policies.get(row.get("policy")),
                source=row["source"],
                external_id=row["external_id"],
                num_steps=len(row["steps"]),
                total_env_reward=sum(step["reward"] for step in row["steps"]),
                success=(row.get("outcome") or {}).get("success"),
                outcome_return=(row.get("outcome") or {}).get("outcome_return"),
                metadata=row["metadata"],
                prompt=row["prompt"],
                tools=row["tools"],
            )
            for row, task in zip(new_rows, tasks, strict=True)
        ]
        _store_trajectories(trajectories, [row["steps"] for row in new_rows])
        result.created += len(trajectories)
        result.trajectory_ids.extend(t.pk for t in trajectories)

    def _resolve_policies(self, rows: list[dict]) -> None:
        names = {row["policy"] for row in rows if row.get("policy")} - set(self.policies)
        if not names:
            return
        self.policies.update(
            (policy.name, policy) for policy in PolicyVersion.objects.filter(project=self.project, name__in=names)
        )
        for name in names - set(self.policies):
            self.policies[name] = PolicyVersion.objects.create(
                project=self.project, name=name, kind=PolicyKind.EXTERNAL
            )


def _store_trajectories(trajectories: list[Trajectory], steps_of: list[list[dict]]) -> None:
    _insert_trajectories(trajectories)
    # JSON goes in as text: SQLite stores it so, and PostgreSQL's COPY parses it into jsonb.
    json_text = json.dumps
    _insert_steps(
        (
            trajectory.pk,
            index,
            json_text(step["message"]),
            json_text(step["replies"]),
            step["observation"],
            step["reasoning"],
            step["action"],
            json_text(step["tool_calls"]),
            step["reward"],
            step["logprob"],
            json_text(step["media"]),
            "{}",
            step["done"] or index == len(steps) - 1,
        )
        for trajectory, steps in zip(trajectories, steps_of, strict=True)
        for index, step in enumerate(steps)
    )


STEP_FIELDS = (
    "trajectory",
    "index",
    "message",
    "replies",
    "observation",
    "reasoning",
    "action",
    "tool_calls",
    "env_reward",
    "logprob",
    "media",
    "render",
    "done",
)


def _insert_trajectories(trajectories: list[Trajectory]) -> None:
    """bulk_create, except on PostgreSQL: there the ids are taken from the table's sequence first and the rows go
    in through COPY, which skips the per-row SQL compiling and quoting that make bulk_create slow. The values are
    still each field's own get_db_prep_save(), so nothing about the model is repeated here."""
    if connection.vendor != "postgresql":
        Trajectory.objects.bulk_create(trajectories, batch_size=1000)
        return
    quote = connection.ops.quote_name
    table = Trajectory._meta.db_table
    fields = Trajectory._meta.concrete_fields
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [table, Trajectory._meta.pk.column, len(trajectories)],
        )
        for trajectory, (pk,) in zip(trajectories, cursor.fetchall(), strict=True):
            trajectory.pk = pk
        columns = ", ".join(quote(field.column) for field in fields)
        with cursor.cursor.copy(f"COPY {quote(table)} ({columns}) FROM STDIN") as copy:
            for trajectory in trajectories:
                copy.write_row(
                    [field.get_db_prep_save(field.pre_save(trajectory, add=True), connection) for field in fields]
                )
    for trajectory in trajectories:
        trajectory._state.adding = False
        trajectory._state.db = connection.alias


def _insert_steps(rows: Iterable[tuple]) -> None:
    """Insert step rows (values in STEP_FIELDS order) with one prepared statement.

    Steps are most of an import's rows, and bulk_create spends about three quarters of its time compiling SQL for
    each object; executemany sends the same statement with plain values instead, several times faster. The values
    are what the fields would store: text, numbers and adapted JSON.
    """
    quote = connection.ops.quote_name
    table = quote(Step._meta.db_table)
    columns = ", ".join(quote(Step._meta.get_field(name).column) for name in STEP_FIELDS)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # PostgreSQL's COPY takes the rows as one stream, several times faster again than executemany.
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(STEP_FIELDS))})"
        rows = iter(rows)
        while batch := list(islice(rows, 5000)):
            cursor.executemany(sql, batch)


def _resolve_tasks(project: Project, refs: list[dict]) -> list[Task]:
    """Find or make each row's task: by external_id, else by seed, else one new task per distinct instruction."""

    def key(ref: dict) -> tuple:
        if ref.get("external_id"):
            return ("external_id", ref["external_id"])
        if ref.get("seed") is not None:
            return ("seed", ref["seed"])
        return ("instruction", ref["instruction"])

    keys = [key(ref) for ref in refs]
    found: dict[tuple, Task] = {}
    by_ext = {k[1] for k in keys if k[0] == "external_id"}
    by_seed = {k[1] for k in keys if k[0] == "seed"}
    if by_ext:
        for task in Task.objects.filter(project=project, external_id__in=by_ext):
            found[("external_id", task.external_id)] = task
    if by_seed:
        for task in Task.objects.filter(project=project, seed__in=by_seed):
            found[("seed", task.seed)] = task
    missing: dict[tuple, Task] = {}
    for k, ref in zip(keys, refs, strict=True):
        if k in found or k in missing:
            continue
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


def import_trajectory_stream(project: Project, rows: Iterable[tuple[int, Any]]) -> ImportResult:
    """Validate and store trajectory rows (from `iter_json_rows`) atomically, streaming."""
    return import_rows(TrajectoryRows(project), rows)


# The command-line import reads the whole file first; these two keep its interface.


def validate_rows(rows: Iterable[tuple[int, Any]]) -> list[dict]:
    """Validate every row; raise ImportRejected listing the first MAX_REPORTED_ERRORS problems if any is bad."""
    kind = TrajectoryRows(project=None)
    valid: list[dict] = []
    errors: list[RowError] = []
    bad = 0
    iterator = iter(rows)
    while batch := list(islice(iterator, BATCH_ROWS)):
        batch_valid, batch_errors, batch_bad = kind.validate(batch)
        valid.extend(batch_valid)
        errors.extend(batch_errors)
        bad += batch_bad
    if bad:
        raise ImportRejected(errors[:MAX_REPORTED_ERRORS], bad)
    return valid


def import_trajectories(project: Project, rows: list[dict]) -> ImportResult:
    """Write validated rows (from `validate_rows`) atomically. Rows whose external_id exists are skipped."""
    result = ImportResult()
    kind = TrajectoryRows(project)
    with transaction.atomic():
        for start in range(0, len(rows), BATCH_ROWS):
            kind.store(rows[start : start + BATCH_ROWS], result)
    return result


# --- Preference labels --------------------------------------------------------------------------------------------


class PreferenceRows(_RowKind):
    """Rows of {prompt, chosen, rejected} (strings, or chat messages as in TRL's conversational format).

    Each prompt becomes one Task (the same prompt text finds the same task), each answer an imported Trajectory,
    and each row a Comparison by the importing user, or by the project member the row names.
    """

    serializer_class = PreferenceImportSerializer

    def __init__(self, project: Project, user) -> None:
        super().__init__(project)
        self.user = user
        self.seen_derived: set[str] = set()
        self.members = {
            username: pk
            for username, pk in get_user_model()
            .objects.filter(memberships__project=project)
            .values_list("username", "pk")
        }

    def context(self) -> dict:
        return {"members": self.members}

    def store(self, rows: list[dict], result: ImportResult) -> None:
        for row in rows:
            row["base_id"] = row.get("external_id") or _derived_id(row)
        # A derived id repeats only for the very same judgement: store it once.
        unique: dict[str, dict] = {}
        for row in rows:
            if row["base_id"] in unique or row["base_id"] in self.seen_derived:
                result.skipped_existing += 1
            else:
                unique[row["base_id"]] = row
        self.seen_derived.update(unique)
        existing = set(
            Trajectory.objects.filter(project=self.project, external_id__in=[f"{b}:chosen" for b in unique])
            .values_list("external_id", flat=True)
            .order_by()
        )
        new_rows = [row for base, row in unique.items() if f"{base}:chosen" not in existing]
        result.skipped_existing += len(unique) - len(new_rows)
        if not new_rows:
            return
        tasks = _resolve_tasks(self.project, [row["task"] for row in new_rows])
        trajectories, steps_of = [], []
        for row, task in zip(new_rows, tasks, strict=True):
            for side in ("chosen", "rejected"):
                metadata = dict(row["metadata"])
                if row.get("margin") is not None:
                    metadata["preference_margin"] = row["margin"]
                trajectories.append(
                    Trajectory(
                        project=self.project,
                        task=task,
                        source=TrajectorySource.IMPORT,
                        external_id=f"{row['base_id']}:{side}",
                        num_steps=len(row[f"{side}_steps"]),
                        metadata=metadata,
                        prompt=row[f"{side}_prompt"],
                    )
                )
                steps_of.append(row[f"{side}_steps"])
        _store_trajectories(trajectories, steps_of)
        comparisons = []
        for row, chosen, rejected in zip(new_rows, trajectories[::2], trajectories[1::2], strict=True):
            first, second = sorted((chosen, rejected), key=lambda t: t.pk)
            comparisons.append(
                Comparison(
                    project=self.project,
                    annotator_id=self.members[row["annotator"]] if row.get("annotator") else self.user.pk,
                    trajectory_a=first,
                    trajectory_b=second,
                    choice="a" if first is chosen else "b",
                    strength=row["strength"],
                    rationale=row["rationale"],
                    query_strategy="import",
                )
            )
        Comparison.objects.bulk_create(comparisons, batch_size=1000)
        result.created += len(comparisons)
        result.trajectory_ids.extend(t.pk for t in trajectories)


def _derived_id(row: dict) -> str:
    content = json.dumps(
        [row["prompt"], row["chosen"], row["rejected"], row.get("annotator") or ""], sort_keys=True, default=str
    )
    return "pref-" + hashlib.sha256(content.encode()).hexdigest()[:40]


def import_preference_stream(project: Project, user, rows: Iterable[tuple[int, Any]]) -> ImportResult:
    """Validate and store preference rows (from `iter_json_rows`) atomically, streaming; `created` counts the
    comparisons."""
    return import_rows(PreferenceRows(project, user), rows)


# --- Helpers ------------------------------------------------------------------------------------------------------


def _json_type(obj: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if obj is None else names.get(type(obj), type(obj).__name__)


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


__all__ = [
    "BodyTooLarge",
    "ImportRejected",
    "ImportResult",
    "RowError",
    "import_preference_stream",
    "import_trajectories",
    "import_trajectory_stream",
    "iter_json_rows",
    "validate_rows",
]
