"""Each launchable run kind's form: its settings, generated from the kind's config dataclass, the judge models it
may (or must) use and the snapshot kinds it reads; and a posted form's config.

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

from feedback_app.models import JudgeKind, RunKind
from reward_models.common import JudgeConfig
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
