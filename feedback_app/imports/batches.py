"""The streaming import loop: rows are validated and stored batch by batch inside one transaction.

The first bad row stops the storing; the rest of the body is still validated so that every bad row is counted (the
first MAX_REPORTED_ERRORS are listed), and then the transaction rolls back.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from django.db import transaction

from feedback_app.imports.results import MAX_REPORTED_ERRORS, ImportRejected, ImportResult, RowError
from feedback_app.imports.validation import RowKind

# Rows are validated and written this many at a time: big enough for bulk inserts, small enough for flat memory.
BATCH_ROWS = 500


def import_rows(kind: RowKind, rows: Iterable[tuple[int, Any]]) -> ImportResult:
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
