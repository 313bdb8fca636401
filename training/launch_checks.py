"""What a judge-model launch (`training.judges`) and a policy launch (`training.policy_runs`) check alike.

A launch reports every bad input at once, so each check here returns why an input is refused ("" when it is not)
and the launch collects the reasons by input name; `LaunchError` carries them all and nothing is stored. Inputs
already refused are left out of the unsaved run, so the config checks that follow read only inputs that passed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from django.db.models import Manager, QuerySet

from feedback_app.models import DatasetSnapshot, PolicyVersion, Project, RegisteredModel, TrainingRun
from feedback_app.models.trajectories import PolicyKind
from reward_models.common.config import config_errors, config_from_dict

# The longest name a launch may give the model or policy version its run makes.
LONGEST_NAME = 120


class LaunchError(ValueError):
    """A run that cannot start. `errors` maps each bad field (``config.<name>`` for a setting) to the reason."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {reason}" for name, reason in self.errors.items()))


def default_base_policy(project: Project) -> PolicyVersion | None:
    """The project's newest policy with local weights: the base a run starts from when the launch names none."""
    return project.policy_versions.filter(kind=PolicyKind.LOCAL).order_by("-created_at", "-id").first()


def snapshot_error(snapshot: DatasetSnapshot, project: Project, kind: str, export_kinds: Collection[str]) -> str:
    """Why a `kind` run of `project` may not read `snapshot`, which must be one of `export_kinds`."""
    if snapshot.project_id != project.pk:
        return "belongs to another project"
    if snapshot.export_kind not in export_kinds:
        return f"is a {snapshot.export_kind} export; a {kind} run reads {' or '.join(export_kinds)}"
    return ""


def base_policy_error(policy: PolicyVersion, project: Project, needs_weights: str) -> str:
    """Why a run of `project` may not start from `policy`: it must be the project's and have local weights that are
    there (`needs_weights` says what the run needs them for)."""
    if policy.project_id != project.pk:
        return "belongs to another project"
    if policy.kind != PolicyKind.LOCAL:
        return f"is a {policy.kind} policy; {needs_weights}"
    if location := policy.location_errors():
        return location["weights_path"]
    return ""


def judge_model_error(model: RegisteredModel, project: Project, kinds: Collection[str]) -> str:
    """Why a run of `project` may not use the registered `model` where it takes one of the judge `kinds`."""
    if model.project_id != project.pk:
        return "belongs to another project"
    if model.kind not in kinds:
        return f"is a {model.kind}, not a {' or '.join(kinds)}"
    return ""


def name_error(config: Mapping[str, Any] | None, taken: Manager | QuerySet, what: str) -> str:
    """Why the ``name`` a launch's `config` gives what its run makes is refused: it must be text of 1 to
    `LONGEST_NAME` characters that none of `taken` (the project's `what`s) has yet. "" when the config names none."""
    name = (config or {}).get("name")
    if name is None:
        return ""
    if not isinstance(name, str) or not name.strip() or len(name) > LONGEST_NAME:
        return f"must be text of 1 to {LONGEST_NAME} characters"
    if taken.filter(name=name).exists():
        return f"the project already has a {what} named {name!r}"
    return ""


def unsaved_run(
    project: Project,
    kind: str,
    *,
    config: Mapping[str, Any] | None,
    snapshot: DatasetSnapshot | None,
    base_policy: PolicyVersion | None,
    inputs: dict[str, Any],
    created_by,
    errors: Mapping[str, str],
) -> TrainingRun:
    """The run a launch stores once every check passes, not saved yet; a snapshot or base policy in `errors` is left
    out of it, so that the config checks do not read an input that was refused."""
    return TrainingRun(
        project=project,
        kind=kind,
        config=dict(config or {}),
        snapshot=None if "snapshot" in errors else snapshot,
        base_policy=None if "base_policy" in errors else base_policy,
        inputs=inputs,
        created_by=created_by,
    )


def stored(run: TrainingRun, errors: Mapping[str, str]) -> TrainingRun:
    """Save the run a launch checked, or raise `LaunchError` naming every refused input and store nothing."""
    if errors:
        raise LaunchError(errors)
    run.save()
    return run


def checked_config(
    config_class: type, values: dict[str, Any], input_name: Callable[[str], str], errors: dict[str, str]
) -> Any:
    """The run's config of `config_class` from `values`, or None with each bad setting added to `errors` under the
    launch input it comes from (`input_name`), beside the errors of the other inputs: the config is built only for a
    launch with no errors at all."""
    found = config_errors(config_class, values)
    for field_name, reason in found.items():
        errors.setdefault(input_name(field_name), reason)
    return None if found or errors else config_from_dict(config_class, values)
