"""Exports as a stream of bytes, JSONL or Parquet, produced as rows are built so memory stays flat at any size.

`export_chunks(project, kind, filters, fmt)` is what the HTTP endpoint, the management command and snapshots all
write; `RowTally` counts the rows going through and remembers which stored rows they came from.
"""

from __future__ import annotations

import datetime as dt
import json
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from feedback_app.exports.filters import ExportFilters, ExportFormat, ExportKind
from feedback_app.exports.kinds import export_rows
from feedback_app.exports.rows import ExportRow
from feedback_app.exports.schemas import export_schema
from feedback_app.models import Project

MEDIA_TYPES = {ExportFormat.JSONL: "application/x-ndjson", ExportFormat.PARQUET: "application/vnd.apache.parquet"}
JSONL_CHUNK_BYTES = 256 * 1024
PARQUET_ROW_GROUP = 5000


class RowTally:
    """Counts rows on their way out and, if asked, remembers the stored rows behind them."""

    def __init__(self, keep_ids: bool = False) -> None:
        self.count = 0
        self.keep_ids = keep_ids
        # Packed 8-byte ids per source: a million-row snapshot costs megabytes here, not a set of a million strings.
        self._ids: dict[str, array] = {}

    def watch(self, rows: Iterable[ExportRow]) -> Iterator[ExportRow]:
        for row in rows:
            self.count += 1
            if self.keep_ids:
                self._ids.setdefault(row.source, array("q")).extend(row.ids)
            yield row

    def row_ids(self) -> list[str]:
        """Distinct `source:id` keys (e.g. ``comparison:12``), sorted by source, then id."""
        return [f"{source}:{pk}" for source in sorted(self._ids) for pk in sorted(set(self._ids[source]))]


def export_chunks(
    project: Project,
    kind: ExportKind,
    filters: ExportFilters,
    fmt: ExportFormat,
    tally: RowTally | None = None,
) -> Iterator[bytes]:
    """The export as consecutive byte chunks. Raises `ExportRequestError` at once (before any chunk) when the
    filters do not suit the kind."""
    rows = (tally or RowTally()).watch(export_rows(project, kind, filters))
    if fmt == ExportFormat.PARQUET:
        schema = export_schema(kind, filters.style, filters.ties)
        return parquet_chunks((parquet_values(row.values) for row in rows), schema)
    return jsonl_chunks(rows)


MESSAGE_COLUMNS = ("prompt", "chosen", "rejected", "completion", "messages")


def parquet_values(values: dict[str, Any]) -> dict[str, Any]:
    """A row as its Parquet schema holds it (`schemas.py`): the tools as one JSON text, and tool-call arguments
    given as a JSON object written as JSON text, the OpenAI form."""
    if "tools" in values:
        values = {**values, "tools": _encode(values["tools"])}
    for name in MESSAGE_COLUMNS:
        turns = values.get(name)
        if isinstance(turns, list) and any(message.get("tool_calls") for message in turns):
            values = {**values, name: [_message_for_parquet(message) for message in turns]}
    completions = values.get("completions")
    if isinstance(completions, list) and completions and isinstance(completions[0], list):
        values = {**values, "completions": [[_message_for_parquet(m) for m in piece] for piece in completions]}
    return values


def _message_for_parquet(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    written = []
    for call in calls:
        function = dict(call.get("function") or {})
        if not isinstance(function.get("arguments", ""), str):
            function["arguments"] = _encode(function["arguments"])
        written.append({**call, "function": function})
    return {**message, "tool_calls": written}


def _json_default(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _row_encoder() -> Callable[[Any], str]:
    """Compact UTF-8 JSON, as `json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode` writes it. Where
    CPython's C encoder is there, one instance of it serves every row: `JSONEncoder.encode` builds a new one per
    call, which was 4 of the 10 microseconds a preference row's remaining columns took to encode."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_json_default).encode
    # No circular-reference check (markers None): a row is a fresh tree of plain values.
    chunks = make(None, _json_default, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    return lambda value: "".join(chunks(value, 0))


_encode = _row_encoder()


def jsonl_line(row: ExportRow) -> str:
    """The row as one line of compact JSON. A row that brings its leading columns as JSON text (`row.json_head`)
    has them spliced in rather than encoded again; the line is the same either way."""
    if row.json_head is None:
        return _encode(row.values)
    if not row.tail:
        return "{" + row.json_head + "}"
    return "".join(("{", row.json_head, ",", _encode(row.tail)[1:]))


def jsonl_chunks(rows: Iterable[ExportRow], chunk_bytes: int = JSONL_CHUNK_BYTES) -> Iterator[bytes]:
    """One JSON object per line (UTF-8), yielded in chunks of about `chunk_bytes`."""
    lines: list[str] = []
    size = 0
    for row in rows:
        line = jsonl_line(row)
        lines.append(line)
        size += len(line)
        if size >= chunk_bytes:
            lines.append("")
            yield "\n".join(lines).encode()
            lines, size = [], 0
    if lines:
        lines.append("")
        yield "\n".join(lines).encode()


class _ChunkSink:
    """A write-only file for pyarrow that hands over what was written since the last `drain()`."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.position = 0
        self.closed = False

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def drain(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def parquet_chunks(rows: Iterable[dict[str, Any]], schema, row_group_size: int = PARQUET_ROW_GROUP) -> Iterator[bytes]:
    """A Parquet file written one row group of `row_group_size` rows at a time; each group's bytes are yielded as
    soon as it is written, and the footer last."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = _ChunkSink()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema, compression="zstd")
    pool = pa.default_memory_pool()
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= row_group_size:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            batch = []
            # Arrow's allocator keeps freed pages for reuse; handing them back keeps a long export's memory flat.
            pool.release_unused()
            yield sink.drain()
    if batch:
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    writer.close()
    yield sink.drain()
