"""The training page's launch form: one input per setting of the chosen run kind's form
(`feedback_app.launch_forms`), the snapshot, base policy and judge model choices, the output options, each with
the value posted (or an old run's) and its error, and the rough run time of the settings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from feedback_app.launch_forms.forms import LAUNCH_KINDS, RunForm, Setting, run_form
from feedback_app.launch_forms.guidance import TINY_RECIPES, estimate
from feedback_app.launch_forms.new_snapshot import SNAPSHOT_FILTERS
from feedback_app.models import DatasetSnapshot, PolicyVersion, Project, RegisteredModel, RunKind
from feedback_app.models.trajectories import PolicyKind
from feedback_app.views.training_runs import duration_text


@dataclass
class Field:
    """One input of the launch form, ready for `_launch_field.html`. `name` is what it posts and the key of its
    error; `input` is select, multiselect (`value` holds the chosen values, comma-separated), checkbox, number, text,
    date or json."""

    name: str
    label: str
    input: str
    value: str = ""
    choices: list[tuple[str, str]] | None = None
    help: str = ""
    error: str = ""
    step: str = "any"

    @property
    def id(self) -> str:
        return "launch-" + self.name.replace(".", "-").replace("_", "-")

    @property
    def chosen(self) -> list[str]:
        """The values a multiple select has selected."""
        return self.value.split(",")


def _setting_field(setting: Setting) -> Field:
    inputs = {"checkbox": "checkbox", "int": "number", "float": "number", "json": "json", "choice": "select"}
    help_text = f"{setting.help} Default: {setting.shown(setting.default) or '(empty)'}."
    return Field(
        f"config.{setting.name}",
        setting.name,
        inputs.get(setting.input, "text"),
        setting.shown(setting.default),
        [(choice, choice) for choice in setting.choices] or None,
        help=help_text.strip(),
        step="1" if setting.input == "int" else "any",
    )


def launch_form_context(
    project: Project, kind: str, values: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    """Everything the launch form of `kind` shows, with `values` (posted, or an old run's) over the defaults and
    each of `errors` beside its input; errors that name no input are listed above the form."""
    form = run_form(kind)
    values, errors = values or {}, errors or {}
    sections: dict[str, list[Field]] = {"data": [], "new_snapshot": [], "models": [], "output": []}
    if form.export_kinds:
        snapshots = list(
            DatasetSnapshot.objects.filter(project=project, export_kind__in=form.export_kinds)
            .select_related("created_by")
            .order_by("-created_at", "-id")
        )
        # No snapshot is chosen for the researcher: the newest may well be someone else's.
        choices = [("", "— choose a snapshot —")] if snapshots else []
        choices += [(str(s.pk), _snapshot_label(s)) for s in snapshots]
        choices.append(("new", "a new snapshot, made now from the filters below"))
        sections["data"].append(Field("snapshot", "Snapshot", "select", "" if snapshots else "new", choices))
        sections["new_snapshot"] += _new_snapshot_fields(project, form)
    sections["models"].append(_base_policy_field(project, form))
    models = list(RegisteredModel.objects.filter(project=project, kind__in={k for c in form.judges for k in c.kinds}))
    for choice in form.judges:
        options = [("", "none" if not choice.required else "— pick one —")]
        options += [(str(m.pk), m.name) for m in models if m.kind in choice.kinds]
        label = f"{choice.label}{' (required)' if choice.required else ''}"
        sections["models"].append(Field(f"judges.{choice.setting}", label, "select", "", options, help=choice.setting))
    if form.takes_name:
        made = "policy version" if form.family == "policy" else "registered model"
        sections["output"].append(Field("config.name", f"Name of the new {made}", "text", help="Optional."))
    if form.family == "policy":
        sections["output"].append(
            Field(
                "review.enabled",
                "Roll the new version out on review tasks and queue blind comparisons against its parent",
                "checkbox",
                "true",
            )
        )
        sections["output"].append(Field("review.num_tasks", "Review tasks", "number", "16", step="1"))
    if "confirm_data" in errors:  # too little data for the settings: launching anyway takes a tick
        sections["data"].append(Field("confirm_data", "Launch anyway", "checkbox", "false"))
    method = [_setting_field(setting) for setting in form.method_settings]
    shared = [_setting_field(setting) for setting in form.shared_settings]
    shown = set()
    for field in [*method, *shared, *(f for fields in sections.values() for f in fields)]:
        field.value = values.get(field.name, field.value)
        field.error = errors.get(field.name, "")
        shown.add(field.name)
    return {
        "form": form,
        "kinds": [(k, RunKind(k).label) for k in LAUNCH_KINDS],
        **sections,
        "new_snapshot_open": bool(sections["data"]) and sections["data"][0].value == "new",
        "method": method,
        "shared": shared,
        "shared_open": any(field.error for field in shared),
        "other_errors": {name: reason for name, reason in errors.items() if name not in shown},
        "recipe": kind in TINY_RECIPES,
        "estimate": estimate_context(project, form, values),
    }


def _snapshot_label(snapshot: DatasetSnapshot) -> str:
    by = f", by {snapshot.created_by.username}" if snapshot.created_by else ""
    made = timezone.localtime(snapshot.created_at)
    return f"{snapshot.name} ({snapshot.export_kind}, {snapshot.row_count} rows{by}, {made:%Y-%m-%d %H:%M})"


def estimate_context(project: Project, form: RunForm, values: dict[str, str]) -> dict[str, Any]:
    """The launch form's rough run time: the whole, and its parts in words."""
    snapshot = values.get("snapshot", "")
    rows = None
    if snapshot.isdigit():
        rows = DatasetSnapshot.objects.filter(project=project, pk=snapshot).values_list("row_count", flat=True).first()
    parts = estimate(form, values, rows)
    return {
        "total": duration_text(timedelta(seconds=sum(seconds for _, seconds in parts))) if parts else "",
        "parts": [(what, duration_text(timedelta(seconds=seconds))) for what, seconds in parts],
    }


def _base_policy_field(project: Project, form: RunForm) -> Field:
    """The policy version the run starts from (or rolls out): always the researcher's choice, never the newest by
    default, which may be someone else's."""
    policies = PolicyVersion.objects.filter(project=project).order_by("-created_at", "-id")
    if form.family == "rollout":
        policies = policies.exclude(kind=PolicyKind.EXTERNAL)
        label = "Policy version to roll out"
    else:
        policies = policies.filter(kind=PolicyKind.LOCAL)
        label = "Base policy (the policy version it starts from)" if form.family == "policy" else "Base model"
    choices = [("", "— choose —")] + [
        (str(p.pk), f"{p.name} ({timezone.localtime(p.created_at):%Y-%m-%d %H:%M})") for p in policies
    ]
    return Field("base_policy", label, "select", "", choices)


def _new_snapshot_fields(project: Project, form: RunForm) -> list[Field]:
    export_kinds = [(kind, kind) for kind in form.export_kinds]
    name = f"{form.kind}-{timezone.localtime():%Y%m%d-%H%M%S}"
    fields = [
        Field("new_snapshot.export_kind", "Export kind", "select", form.export_kinds[0], export_kinds),
        Field("new_snapshot.name", "New snapshot's name", "text", name),
    ]
    for snapshot_filter in SNAPSHOT_FILTERS:
        if not snapshot_filter.applies(form.export_kinds):
            continue
        choices = [(str(choice), str(choice)) for choice in snapshot_filter.choices] or None
        if snapshot_filter.name == "policy_versions":
            choices = [(str(p.pk), p.name) for p in project.policy_versions.order_by("-created_at", "-id")]
        default = "false" if snapshot_filter.input == "checkbox" else (choices[0][0] if choices else "")
        if snapshot_filter.input == "multiselect":
            default = ""  # nothing selected: no filter
        input_type = "number" if snapshot_filter.input == "float" else snapshot_filter.input
        fields.append(
            Field(f"new_snapshot.{snapshot_filter.name}", snapshot_filter.label, input_type, default, choices)
        )
    return fields
