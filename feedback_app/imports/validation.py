"""Validating rows batch by batch: the RowKind base that checks a batch of parsed rows and words its errors.

A row is checked by a kind's fast path when it has one, else by the kind's DRF serializer (one list serializer per
batch), and then across rows (a repeated external_id). Each kind also says how its valid rows are stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from feedback_app.imports.results import ImportResult, RowError
from feedback_app.models import Project
from feedback_app.text_checks import json_problem


class RowKind:
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
