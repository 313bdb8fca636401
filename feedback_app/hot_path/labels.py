"""New labels, inserted with statements written once (save() would build the INSERT again for each, and there are
no signal receivers on labels to miss), and the annotator's current comparison of a pair with its row locked, the
revision check of a comparison (see `feedback_app.hot_path`)."""

from __future__ import annotations

from functools import cache

from django.db import connection

from feedback_app.hot_path.rows import Rows, fetch_one
from feedback_app.models import Comparison


@cache
def label_rows(model) -> Rows:
    """The rows of the label model `model`: its inserts (`Rows.insert`) and reads."""
    return Rows(model, "c")


# The `current` query of a comparison, its row locked. Parameters: annotator, trajectory a, trajectory b.
_CURRENT_COMPARISON_SQL = (
    f"SELECT {label_rows(Comparison).columns} FROM {label_rows(Comparison).table}"
    " WHERE c.annotator_id = %s AND c.trajectory_a_id = %s AND c.trajectory_b_id = %s AND c.is_current"
    + (" FOR UPDATE" if connection.features.has_select_for_update else "")
)


def current_comparison(annotator_pk: int, trajectory_a_pk: int, trajectory_b_pk: int) -> Comparison | None:
    """The annotator's current comparison of the pair, its row locked (where the database locks rows)."""
    row = fetch_one(_CURRENT_COMPARISON_SQL, [annotator_pk, trajectory_a_pk, trajectory_b_pk])
    return None if row is None else label_rows(Comparison).read(row)
