"""Dataset exports and snapshots: labels as rows that TRL and `datasets` read as they are.

    filters = ExportFilters.from_query({"min_agreement": "0.6", "exclude_gold": "true"})
    for chunk in export_chunks(project, ExportKind.PREFERENCE, filters, ExportFormat.JSONL):
        out.write(chunk)
    snapshot = create_snapshot(project, "preference", filters, user=user, name="rm-data-v1")

Modules: `filters` (what a request may ask, validated), `aggregate` (several annotators into one verdict),
`conversation` (trajectories as chat turns), `rows` (the row type and reading labels in batches), one row generator
per kind (`preference`, `step_preference`, `stepwise`, `unpaired`, `sft`, `critiques`, `raw`, `returns`; each builds
its rows with the row contract, `reward_models.rows`), `kinds` (which generator each kind uses), `schemas` (the
columns), `stream` (JSONL and Parquet bytes), `snapshots` (frozen, hashed exports).
"""

from feedback_app.exports.filters import (
    Aggregation,
    ExportFilters,
    ExportFormat,
    ExportKind,
    ExportRequestError,
    Interventions,
    Neutral,
    Style,
    Ties,
)
from feedback_app.exports.kinds import export_rows
from feedback_app.exports.rows import ExportRow
from feedback_app.exports.snapshots import (
    DATASETS_BUILDER,
    create_snapshot,
    read_snapshot_rows,
    snapshot_filters,
    snapshot_format,
)
from feedback_app.exports.stream import MEDIA_TYPES, RowTally, export_chunks

__all__ = [
    "DATASETS_BUILDER",
    "MEDIA_TYPES",
    "Aggregation",
    "ExportFilters",
    "ExportFormat",
    "ExportKind",
    "ExportRequestError",
    "ExportRow",
    "Interventions",
    "Neutral",
    "RowTally",
    "Style",
    "Ties",
    "create_snapshot",
    "export_chunks",
    "export_rows",
    "read_snapshot_rows",
    "snapshot_filters",
    "snapshot_format",
]
