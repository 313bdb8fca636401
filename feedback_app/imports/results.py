"""What an import reports: its result, and the errors that stop it.

A bad row is a RowError (row number, field, reason); ImportRejected carries the first MAX_REPORTED_ERRORS of them and
the count of bad rows; BodyTooLarge stops the reading of a body over its limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"The body is larger than the {limit} bytes an import may have.")


@dataclass
class ImportResult:
    created: int = 0
    skipped_existing: int = 0
    trajectory_ids: list[int] = field(default_factory=list)
