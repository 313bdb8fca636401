"""A snapshot frozen as part of a launch: the filters the launch form offers for it, and freezing it with the
launch's errors named after the form's ``new_snapshot.<filter>`` inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from feedback_app.exports.filters import (
    AGGREGATED_KINDS,
    TIED_KINDS,
    Aggregation,
    ExportFilters,
    ExportKind,
    ExportRequestError,
    Interventions,
    Neutral,
    Ties,
)
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.launch_forms.forms import RunForm
from feedback_app.models import DatasetSnapshot, Project
from feedback_app.models.trajectories import TrajectorySource
from training.launch import LaunchError


@dataclass(frozen=True)
class SnapshotFilter:
    name: str
    label: str
    input: str  # select, multiselect (posted as several values, read comma-separated), date, float or checkbox
    choices: tuple[str, ...] = ()
    applies_to: frozenset[str] | None = None  # export kinds it means something for; None: every kind but returns

    def applies(self, export_kinds: tuple[str, ...]) -> bool:
        if self.applies_to is None:
            return any(kind != ExportKind.RETURNS for kind in export_kinds)
        return any(kind in self.applies_to for kind in export_kinds)


SNAPSHOT_FILTERS = (
    SnapshotFilter("since", "Labels since", "date", applies_to=frozenset(ExportKind)),
    SnapshotFilter("until", "Labels until", "date", applies_to=frozenset(ExportKind)),
    # Rows whose trajectories come from some sources or versions only; the choices of versions are the project's.
    SnapshotFilter("sources", "Only trajectories from", "multiselect", tuple(TrajectorySource), frozenset(ExportKind)),
    SnapshotFilter(
        "policy_versions", "Only trajectories of the policy versions", "multiselect", (), frozenset(ExportKind)
    ),
    SnapshotFilter("exclude_gold", "Leave out gold items", "checkbox"),
    SnapshotFilter(
        "aggregate", "Several annotators' labels", "select", tuple(Aggregation), frozenset(AGGREGATED_KINDS)
    ),
    SnapshotFilter("min_agreement", "Least agreement (0 to 1)", "float", applies_to=frozenset(AGGREGATED_KINDS)),
    SnapshotFilter("ties", "Ties", "select", tuple(Ties), frozenset(TIED_KINDS)),
    SnapshotFilter("neutral", "Neutral step labels", "select", tuple(Neutral), frozenset({ExportKind.STEPWISE})),
    SnapshotFilter(
        "interventions", "Intervention labels", "select", tuple(Interventions), frozenset({ExportKind.STEPWISE})
    ),
)


@dataclass(frozen=True)
class NewSnapshot:
    """A snapshot to freeze as part of a launch: its export kind, its name and its filters (query-string values)."""

    export_kind: str
    name: str
    filters: Mapping[str, str]

    @classmethod
    def from_form(cls, form: RunForm, data: Mapping[str, str]) -> NewSnapshot:
        export_kind = data.get("new_snapshot.export_kind") or form.export_kinds[0]
        filters = {}
        for snapshot_filter in SNAPSHOT_FILTERS:
            value = data.get(f"new_snapshot.{snapshot_filter.name}", "").strip()
            if value and not (snapshot_filter.input == "checkbox" and value == "false"):
                filters[snapshot_filter.name] = value
        return cls(export_kind, data.get("new_snapshot.name", ""), filters)

    def create(self, project: Project, form: RunForm, user) -> DatasetSnapshot:
        """Freeze it (synchronously, as the training page's own snapshot form does); `LaunchError` names the bad
        ``new_snapshot.<field>``."""
        if self.export_kind not in form.export_kinds:
            raise LaunchError(
                {"new_snapshot.export_kind": f"a {form.kind} run reads {' or '.join(form.export_kinds)} snapshots"}
            )
        try:
            filters = ExportFilters.from_query(self.filters)
            return create_snapshot(project, self.export_kind, filters, user=user, name=self.name)
        except ExportRequestError as exc:
            raise LaunchError({f"new_snapshot.{name}": reason for name, reason in exc.errors.items()}) from None
