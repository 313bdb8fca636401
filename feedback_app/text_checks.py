"""What every text and JSON value Tandem stores must be: valid Unicode without NUL, nested at most `MAX_JSON_DEPTH`
deep, with finite numbers and integers that fit a 64-bit column.

A lone surrogate (``"\\ud800"`` in JSON) parses into a Python string that cannot be encoded as UTF-8: stored, it
breaks every later response that holds the row. PostgreSQL refuses NUL in text and jsonb. Deep nesting overflows
the parser's and the encoder's recursion. Every entry point (the API's parsers, the import streams, the forms)
runs its input through `json_problem`, and refuses it with a 400 that names the field.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_JSON_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored, or None."""
    match = _BAD_TEXT.search(value)
    if match is None:
        return None
    if match.group() == "\x00":
        return "contains a NUL character (U+0000)"
    return f"contains a lone surrogate (U+{ord(match.group()):04X}), which is not valid Unicode"


def json_problem(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first ``(path, reason)`` that makes a parsed JSON value unstorable, or None. ``path`` names the place
    the way a client wrote it (``spec.goal[2]``)."""
    if isinstance(value, str):
        reason = text_problem(value)
        return (path, reason) if reason else None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, "is not a finite number (NaN and Infinity are not JSON)")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            return path, "is an integer outside the 64-bit range"
        return None
    if depth >= MAX_JSON_DEPTH:
        return path, f"is nested more than {MAX_JSON_DEPTH} levels deep"
    if isinstance(value, dict):
        for key, item in value.items():
            reason = text_problem(key)
            if reason:
                return _join(path, repr(key)[1:-1]), f"has a key that {reason}"
            found = json_problem(item, _join(path, key), depth + 1)
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = json_problem(item, f"{path}[{index}]", depth + 1)
            if found:
                return found
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
