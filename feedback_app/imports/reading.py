"""Reading an import body as rows: JSON Lines, or one JSON array, streamed chunk by chunk under a size limit.

Each row comes out as (row number, parsed object), or a RowError in place of an object that does not parse, so the
validation can report every bad line. A JSON array's elements are cut out by `array_reader`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import chain
from typing import IO, Any

from feedback_app.imports.array_reader import ArrayRows, reject_constant
from feedback_app.imports.results import BodyTooLarge, RowError

CHUNK_BYTES = 1 << 20


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
        yield from ArrayRows(head, chunks)
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
        yield number, json.loads(line, parse_constant=reject_constant)
    except json.JSONDecodeError as exc:
        yield number, RowError(number, "(line)", f"malformed JSON on line {number}: {exc.msg} at column {exc.colno}")
    except ValueError as exc:  # not UTF-8, or NaN / Infinity
        yield number, RowError(number, "(line)", f"malformed JSON on line {number}: {exc}")
    except RecursionError:
        yield number, RowError(number, "(line)", f"line {number} is nested too deeply")
