"""Which generator builds each export kind's rows: the one table of kinds, above the modules that build them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from feedback_app.exports.critiques import critique_rows
from feedback_app.exports.filters import ExportFilters, ExportKind
from feedback_app.exports.preference import preference_rows
from feedback_app.exports.raw import raw_rows
from feedback_app.exports.returns import returns_rows
from feedback_app.exports.rows import ExportRow
from feedback_app.exports.sft import sft_rows
from feedback_app.exports.step_preference import step_preference_rows
from feedback_app.exports.stepwise import stepwise_rows
from feedback_app.exports.unpaired import unpaired_rows
from feedback_app.models import Project


def export_rows(project: Project, kind: ExportKind, filters: ExportFilters) -> Iterator[ExportRow]:
    """The rows of one export kind, in a deterministic order (the same database state gives the same rows)."""
    builders: dict[ExportKind, Callable[[Project, ExportFilters], Iterator[ExportRow]]] = {
        ExportKind.PREFERENCE: preference_rows,
        ExportKind.STEP_PREFERENCE: step_preference_rows,
        ExportKind.STEPWISE: stepwise_rows,
        ExportKind.UNPAIRED: unpaired_rows,
        ExportKind.SFT: sft_rows,
        ExportKind.CRITIQUES: critique_rows,
        ExportKind.RAW: raw_rows,
        ExportKind.RETURNS: returns_rows,
    }
    filters.check_kind(kind)
    return builders[kind](project, filters)
