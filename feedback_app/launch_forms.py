"""Launching any kind of run from the dashboard: what each kind's form asks for, and how a posted form (or an old
run, for a re-run) becomes a queued run.

The settings come from the run kind's config dataclass: its fields, types, defaults and ``help`` metadata, less the
ones Tandem fills in itself (the snapshot file, the base weights, the run directory, the environment, the judge
models' directories). A new setting in a trainer therefore appears on the dashboard without touching a template. A
posted value equal to its default is left out of the run's config, so the config records what the researcher chose.

Every launch goes through the same create functions as the REST API (`training.launch`), so the checks are the same
and a bad launch raises `LaunchError` naming each field with the names the form's inputs carry: ``snapshot``,
``base_policy``, ``judges.<setting>``, ``config.<setting>``, ``review.<option>`` and ``new_snapshot.<filter>``.

    >>> form = run_form("ppo")
    >>> [choice.setting for choice in form.judges]
    ['reward_model_path', 'prm_path', 'value_critic_path']
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import transaction

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
from feedback_app.exports.snapshots import create_snapshot, snapshot_file
from feedback_app.models import (
    DatasetSnapshot,
    JudgeKind,
    PolicyVersion,
    Project,
    RegisteredModel,
    RunKind,
    TrainingRun,
)
from feedback_app.models.trajectories import TrajectorySource
from reward_models.common.config import config_errors, config_from_dict
from reward_models.common.judge_config import JudgeConfig
from reward_models.finetune.common import PolicyTrainConfig
from training import launch
from training.launch import LaunchError, RolloutConfig

# In the order of the loop: judges from labels, the policy from labels or judges, then rollouts of a version.
LAUNCH_KINDS: tuple[str, ...] = (*launch.JUDGE_RUN_KINDS, *launch.POLICY_RUN_KINDS, RunKind.ROLLOUT)


@dataclass(frozen=True)
class Setting:
    """One config field as a form input: `input` is checkbox, int, float, text, choice (one of the field's
    ``choices`` metadata: a select), list (comma-separated) or json."""

    name: str
    input: str
    default: Any
    help: str
    shared: bool  # declared by the family's base config (every judge, or every policy trainer, has it)
    item_type: type = str  # a list's items
    choices: tuple[str, ...] = ()

    def shown(self, value: Any) -> str:
        """`value` as the input's text."""
        if value is None:
            return ""
        if self.input == "checkbox":
            return "true" if value else "false"
        if self.input == "list":
            return ", ".join(str(item) for item in value)
        if self.input == "json":
            return json.dumps(value, sort_keys=True)
        return str(value)

    def parse(self, text: str) -> Any:
        """The input's text as the field's value; `ValueError` says what is wrong."""
        text = text.strip()
        if self.input == "checkbox":
            if text.lower() in ("true", "on", "1"):
                return True
            if text.lower() in ("false", "off", "0", ""):
                return False
            raise ValueError("must be true or false")
        if self.input == "int":
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"must be a whole number, not {text!r}") from None
        if self.input == "float":
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"must be a number, not {text!r}") from None
            if not math.isfinite(value):
                raise ValueError("must be a finite number")
            return value
        if self.input == "list":
            items = [item.strip() for item in text.split(",") if item.strip()]
            if self.item_type is int:
                try:
                    return [int(item) for item in items]
                except ValueError:
                    raise ValueError("must be whole numbers separated by commas") from None
            return items
        if self.input == "json":
            try:
                value = json.loads(text or "{}")
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(value, dict):
                raise ValueError('must be a JSON object, e.g. {"size": 5}')
            return value
        if self.input == "choice" and text not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}, not {text!r}")
        return text


@dataclass(frozen=True)
class JudgeChoice:
    """A judge model the run may (or must) use: the config setting it fills and the registry kinds that fit."""

    setting: str
    kinds: tuple[str, ...]
    required: bool

    @property
    def label(self) -> str:
        return " or ".join(str(JudgeKind(kind).label) for kind in self.kinds)


@dataclass(frozen=True)
class RunForm:
    """What a run kind's launch form asks for."""

    kind: str
    family: str  # judge, policy or rollout
    export_kinds: tuple[str, ...]  # the snapshot kinds it reads; () for none
    judges: tuple[JudgeChoice, ...]
    settings: tuple[Setting, ...]

    @property
    def label(self) -> str:
        return str(RunKind(self.kind).label)

    @property
    def method_settings(self) -> list[Setting]:
        return [setting for setting in self.settings if not setting.shared]

    @property
    def shared_settings(self) -> list[Setting]:
        return [setting for setting in self.settings if setting.shared]

    @property
    def takes_name(self) -> bool:
        """Whether the run makes something it can name (a registered model or a policy version)."""
        return self.family != "rollout"


@cache
def run_form(kind: str) -> RunForm:
    """The form of a launchable run kind. Raises `LaunchError` for any other kind."""
    if kind in launch.PIPELINES:
        pipeline = launch.PIPELINES[kind]
        config_class = pipeline.config_class
        judge_inputs = pipeline.judge_inputs or {}
        managed = {*launch.JUDGE_MANAGED_SETTINGS, *judge_inputs}
        choices = tuple(JudgeChoice(setting, (kind_,), False) for setting, kind_ in judge_inputs.items())
        return RunForm(kind, "judge", pipeline.export_kinds, choices, _settings(config_class, managed, JudgeConfig))
    if kind in launch.TRAINERS:
        trainer = launch.TRAINERS[kind]
        config_class = trainer.config_class
        implied_by_snapshot = {name for implied in trainer.export_kinds.values() for name in implied}
        managed = {*launch.POLICY_MANAGED_SETTINGS, *trainer.judge_inputs, *trainer.implied, *implied_by_snapshot}
        choices = tuple(
            JudgeChoice(setting, tuple(kinds), setting in trainer.required_judges)
            for setting, kinds in trainer.judge_inputs.items()
        )
        settings = _settings(config_class, managed, PolicyTrainConfig)
        return RunForm(kind, "policy", tuple(trainer.export_kinds), choices, settings)
    if kind == RunKind.ROLLOUT:
        return RunForm(kind, "rollout", (), (), _settings(RolloutConfig, set(), None))
    raise LaunchError({"kind": f"not a kind the dashboard launches; the kinds are {', '.join(LAUNCH_KINDS)}"})


def _settings(config_class: type, managed: set[str], base: type | None) -> tuple[Setting, ...]:
    hints = typing.get_type_hints(config_class)
    shared = {field.name for field in dataclasses.fields(base)} if base else set()
    settings = []
    for field in dataclasses.fields(config_class):
        if field.name in managed:
            continue
        input_type, item_type = _input_for(hints[field.name])
        choices = tuple(field.metadata.get("choices", ()))
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        settings.append(
            Setting(
                field.name,
                "choice" if choices and input_type == "text" else input_type,
                default,
                field.metadata.get("help", ""),
                shared=field.name in shared,
                item_type=item_type,
                choices=choices,
            )
        )
    return tuple(settings)


def _input_for(hint: Any) -> tuple[str, type]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    origin = typing.get_origin(hint) or hint
    if origin is list:
        args = typing.get_args(hint)
        return "list", args[0] if args and args[0] in (int, str) else str
    inputs = {bool: "checkbox", int: "int", float: "float", dict: "json"}
    return inputs.get(origin, "text"), str


def config_from_form(form: RunForm, data: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The run's config from posted `data` (``config.<setting>`` inputs; one not posted keeps its default): only the
    values that differ from the defaults, and the errors of the ones that do not parse, by input name."""
    config: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for setting in form.settings:
        key = f"config.{setting.name}"
        if key not in data:
            continue
        try:
            value = setting.parse(data[key])
        except ValueError as exc:
            errors[key] = str(exc)
            continue
        if value != setting.default:
            config[setting.name] = value
    name = data.get("config.name", "").strip()
    if name and form.takes_name:
        config["name"] = name
    return config, errors


# --- snapshots made at launch --------------------------------------------------------------------------------------


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


# --- launching -----------------------------------------------------------------------------------------------------


def launch_run(
    project: Project,
    kind: str,
    *,
    snapshot: DatasetSnapshot | None = None,
    new_snapshot: NewSnapshot | None = None,
    base_policy: PolicyVersion | None = None,
    base_model: str = "",
    judges: Mapping[str, RegisteredModel] | None = None,
    config: Mapping[str, Any] | None = None,
    review: Mapping[str, Any] | None = None,
    created_by=None,
    errors: Mapping[str, str] | None = None,
    confirmed: bool = True,
) -> TrainingRun:
    """Store a run of `kind` through its family's create function and queue it once the transaction commits. With
    `new_snapshot`, freeze that snapshot first, in the same transaction: a launch that fails stores neither (and
    removes the file). Raises `LaunchError` naming every bad field at once: `errors` (what the form already found,
    e.g. a value that does not parse) with every check's. Unless `confirmed`, a run the snapshot would give less
    than a batch of data is refused too, its warning under ``confirm_data``."""
    form = run_form(kind)
    errors = dict(errors or {})
    with transaction.atomic():
        made = run = None
        if new_snapshot is not None:
            try:
                made = snapshot = new_snapshot.create(project, form, created_by)
            except LaunchError as exc:
                errors.update(exc.errors)
        try:
            run = _create(project, form, snapshot, base_policy, base_model, judges, config, review, created_by)
        except LaunchError as exc:
            # The snapshot not made from bad filters is reported beside those filters, not as a missing snapshot.
            snapshot_failed = any(name.startswith("new_snapshot.") for name in errors)
            for name, reason in exc.errors.items():
                if not (name == "snapshot" and snapshot_failed):
                    errors.setdefault(name, reason)  # what the form found first says more ("no such choice")
        warning = ((run.inputs or {}).get("data") or {}).get("warning") if run is not None else None
        if warning and not confirmed:
            errors["confirm_data"] = warning
        if errors:
            transaction.set_rollback(True)
            if made is not None:
                snapshot_file(made).unlink(missing_ok=True)
            raise LaunchError(errors)
        launch.send(run)
    return run


def _create(project, form: RunForm, snapshot, base_policy, base_model, judges, config, review, user) -> TrainingRun:
    if form.family == "judge":
        return launch.create_judge_run(
            project, form.kind, snapshot=snapshot, base_policy=base_policy, base_model=base_model, judges=judges,
            config=config, created_by=user,
        )  # fmt: skip
    if form.family == "policy":
        return launch.create_policy_run(
            project, form.kind, snapshot=snapshot, base_policy=base_policy, judges=judges, config=config,
            review=review, created_by=user,
        )  # fmt: skip
    return _create_rollout(project, base_policy, config or {}, user)


def _create_rollout(project: Project, policy: PolicyVersion | None, values: Mapping[str, Any], user) -> TrainingRun:
    errors: dict[str, str] = {}
    policy = policy or project.policy_versions.exclude(kind="external").order_by("-created_at", "-id").first()
    if policy is None:
        errors["base_policy"] = "the project has no policy version Tandem can run"
    elif policy.kind == "external":
        errors["base_policy"] = f"{policy.name} is external: Tandem cannot run it, only import its trajectories"
    elif location := policy.location_errors():
        errors["base_policy"] = next(iter(location.values()))
    errors.update(
        {
            f"config.{name}" if name else "config": reason
            for name, reason in config_errors(RolloutConfig, values).items()
        }
    )
    if errors:
        raise LaunchError(errors)
    return launch.create_rollout_run(project, policy, config_from_dict(RolloutConfig, values), created_by=user)


def rerun(run: TrainingRun, *, created_by=None) -> TrainingRun:
    """A new run of the same kind with the same snapshot, base policy, judge models, settings and review options,
    through `launch_run`'s checks. Its product takes the default name (the old run's name belongs to the old run's
    model or policy version)."""
    run_form(run.kind)  # refuses a kind the dashboard does not launch (bootstrap, evaluation)
    config = {name: value for name, value in run.config.items() if name != "name"}
    chosen: dict[str, RegisteredModel] = {}
    missing: dict[str, str] = {}
    judge_ids = (run.inputs or {}).get("judges") or {}
    found = RegisteredModel.objects.in_bulk(judge_ids.values())
    for setting, model_id in judge_ids.items():
        if model_id in found:
            chosen[setting] = found[model_id]
        else:
            missing[f"judges.{setting}"] = f"the judge model the run used (id {model_id}) is no longer registered"
    if missing:
        raise LaunchError(missing)
    review = (run.inputs or {}).get("review") or {}
    return launch_run(
        run.project,
        run.kind,
        snapshot=run.snapshot,
        base_policy=run.base_policy,
        base_model=(run.inputs or {}).get("base_model", "") if run.base_policy is None else "",
        judges=chosen,
        config=config,
        review=review,
        created_by=created_by,
    )


def launch_values(run: TrainingRun) -> dict[str, str]:
    """The launch form's inputs filled in as `run` was launched (for a re-run that needs fixing)."""
    form = run_form(run.kind)
    values = {"kind": run.kind, "base_policy": str(run.base_policy_id or ""), "snapshot": str(run.snapshot_id or "")}
    for setting in form.settings:
        if setting.name in run.config:
            values[f"config.{setting.name}"] = setting.shown(run.config[setting.name])
    for setting, model_id in ((run.inputs or {}).get("judges") or {}).items():
        values[f"judges.{setting}"] = str(model_id)
    review = (run.inputs or {}).get("review") or {}
    if review:
        values["review.enabled"] = "true" if review.get("enabled", True) else "false"
        values["review.num_tasks"] = str(review.get("num_tasks", ""))
    return values


# --- the form's guidance: recipes and a run-time estimate -----------------------------------------------------------

# Settings the project's own benchmarks found to work for the built-in tiny models (a Llama of width 64 to 128 built
# from config), where a trainer's defaults suit pretrained models: bench/judge_oracle.py's recipes, and the reward
# model's `moves` layout from bench/loop.py (a judge that reads the policy's reasoning can be gamed through it).
TINY_RECIPES: dict[str, dict[str, str]] = {
    RunKind.REWARD_MODEL: {"config.learning_rate": "0.001", "config.num_epochs": "3", "config.layout": "moves"},
    RunKind.PRM: {"config.learning_rate": "0.005", "config.num_epochs": "5", "config.batch_size": "8"},
    RunKind.VALUE_CRITIC: {"config.learning_rate": "0.002", "config.num_epochs": "5", "config.batch_size": "8"},
}

# Rough costs on 2 CPU cores with the built-in tiny policy. A held-out evaluation of 200 tasks, a greedy and a sampled
# episode each, took 90 s: about 0.22 s an episode. DPO made 100 optimiser steps of 16 pairs in 2-3 minutes: about
# 0.1 s an example. The judge pipelines learn 8 to 19 examples a second (bench/train_bench.py).
EPISODE_SECONDS = 0.22
POLICY_EXAMPLE_SECONDS = 0.1
JUDGE_EXAMPLE_SECONDS = 0.1


def estimate(form: RunForm, values: Mapping[str, str], rows: int | None) -> list[tuple[str, float]]:
    """A rough run time in parts, each `(what, seconds)`, for the form's settings (`values`, as posted; a value that
    does not parse counts as its default) on a snapshot of `rows` rows (None: not known yet)."""
    setting = _setting_values(form, values)
    if form.family == "rollout":
        episodes = setting["num_tasks"] * setting["samples_per_task"]
        return [(f"rolling out {episodes} episodes", episodes * EPISODE_SECONDS)]
    if form.family == "judge":
        if rows is None:
            return []
        steps = setting["max_steps"]
        epochs = setting["num_epochs"] if steps < 0 else steps * setting["batch_size"] / max(rows, 1)
        examples = epochs * rows * setting.get("ensemble_size", 1)
        return [(f"training on {round(examples)} examples", examples * JUDGE_EXAMPLE_SECONDS)]
    parts = []
    evaluations = 2 if setting["eval_base"] else 1
    episodes = setting["eval_tasks"] * (1 + setting["eval_samples"]) * evaluations
    if episodes:
        whose = "the base and the trained policy" if evaluations == 2 else "the trained policy"
        parts.append((f"evaluating {whose} on {episodes} held-out episodes", episodes * EPISODE_SECONDS))
    if form.export_kinds:
        steps = setting["max_steps"]
        if rows is not None:
            steps = min(steps, math.ceil(setting.get("num_epochs", 1) * rows / setting["batch_size"]))
        parts.append((f"{steps} optimiser steps", steps * setting["batch_size"] * POLICY_EXAMPLE_SECONDS))
    else:
        rollouts = setting["max_steps"] * setting.get("rollouts_per_step", setting["batch_size"])
        seconds = rollouts * (EPISODE_SECONDS + POLICY_EXAMPLE_SECONDS)
        parts.append((f"{setting['max_steps']} iterations of rollouts and updates ({rollouts} episodes)", seconds))
    return parts


def _setting_values(form: RunForm, values: Mapping[str, str]) -> dict[str, Any]:
    parsed = {}
    for setting in form.settings:
        try:
            parsed[setting.name] = setting.parse(values[f"config.{setting.name}"])
        except (KeyError, ValueError):
            parsed[setting.name] = setting.default
    if parsed.get("batch_size", 1) < 1:  # a bad value the launch will refuse; the estimate still reads
        parsed["batch_size"] = next(s.default for s in form.settings if s.name == "batch_size")
    return parsed
