"""Reading the elements of a top-level JSON array one at a time, from a body that arrives in chunks.

The array is not parsed whole: each element is decoded by the standard library's C decoder (`raw_decode`) as soon as
it is complete, so memory holds one element and one chunk. The scanning between elements is done here by hand rather
than by an incremental parser such as ijson (yajl2_c), which is several times slower on trajectory rows
and loses behaviour the import promises: its errors carry no line number, it turns a lone surrogate escape into "?",
it refuses integers beyond 64 bits, and it has no bound on the size of one element.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any

from feedback_app.imports.results import RowError

# In a JSON array a row is only known to be malformed, rather than cut by a chunk boundary, once this much of it has
# been read. JSON Lines has no such limit.
MAX_ARRAY_ROW_BYTES = 16 << 20


def reject_constant(name: str) -> Any:
    """`parse_constant` for the JSON decoders: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON (use null)")


_SPACE = re.compile(r"[ \t\r\n]*")


class ArrayRows:
    """Yield the elements of a top-level JSON array one at a time, reading chunk by chunk."""

    def __init__(self, head: bytes, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.decode = codecs.getincrementaldecoder("utf-8")(errors="strict").decode
        self.decoder = json.JSONDecoder(parse_constant=reject_constant)
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
