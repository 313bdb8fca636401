"""Importing external trajectories and preference labels, streamed and atomic.

Rows are read from a JSON Lines stream (or a JSON array), validated in batches and written in batches inside one
transaction, so memory stays flat however long the file is. The first bad row stops the writing; the rest of the
file is still validated so the caller learns about every bad row (the first MAX_REPORTED_ERRORS are listed), and
then the transaction rolls back: an import never leaves half a file behind. `external_id` makes a retried import
idempotent: rows already stored are skipped.

This module is the package's front door: the reader, the two streaming imports and the command's two steps, with
their results and errors. Inside, `reading` and `array_reader` parse the body, `validation`, `fast_path` and `batches`
check rows, `storing` and `bulk_sql` write them, and `trajectories` and `preferences` are the two kinds of row.
"""

from feedback_app.imports.preferences import import_preference_stream
from feedback_app.imports.reading import iter_json_rows
from feedback_app.imports.results import BodyTooLarge, ImportRejected, ImportResult, RowError
from feedback_app.imports.trajectories import import_trajectories, import_trajectory_stream, validate_rows

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
