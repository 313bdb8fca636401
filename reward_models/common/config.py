"""Checking a pipeline's dataclass config: `ConfigError` (a bad setting, by field), `require` for
`__post_init__` checks, `choice` settings that `check_choices` holds to their choices, and building a config from
JSON-like values (a run's stored settings) with every bad setting named."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field, fields
from typing import Any, TypeVar

C = TypeVar("C")


class ConfigError(ValueError):
    """A bad setting. `field` names it; the message is ``"<field>: <reason>"``."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field = field_name
        self.reason = reason
        super().__init__(f"{field_name}: {reason}")


def require(condition: bool, field_name: str, reason: str) -> None:
    """Raise `ConfigError(field_name, reason)` unless `condition`; for `__post_init__` checks."""
    if not condition:
        raise ConfigError(field_name, reason)


def choice(default: str, choices: Sequence[str], help: str) -> Any:
    """A setting that takes one of `choices`: the launch forms and command lines offer them (the field's
    ``choices`` metadata), and `check_choices` refuses any other value."""
    return field(default=default, metadata={"choices": tuple(choices), "help": help})


def check_choices(config: Any) -> None:
    """Raise `ConfigError` for the first `choice` setting of `config` whose value is not one of its choices."""
    for setting in fields(config):
        choices = setting.metadata.get("choices")
        value = getattr(config, setting.name)
        if choices is not None and value not in choices:
            raise ConfigError(setting.name, f"must be one of {', '.join(choices)}, not {value!r}")


def config_from_dict(cls: type[C], values: Mapping[str, Any]) -> C:
    """Build config `cls` from JSON-like values (a run's stored config), refusing unknown names and values of the
    wrong type with a `ConfigError` that names the field. Ints are accepted where floats are expected."""
    known = {f.name: f for f in fields(cls)}
    for name in values:
        if name not in known:
            raise ConfigError(name, f"unknown setting; the settings are {', '.join(sorted(known))}")
    hints = typing.get_type_hints(cls)
    checked = {name: _checked_value(name, value, hints[name]) for name, value in values.items()}
    return cls(**checked)


def config_errors(cls: type, values: Mapping[str, Any]) -> dict[str, str]:
    """Every bad setting in `values` for config `cls`, by field name; {} when `config_from_dict(cls, values)` would
    build it. `__post_init__` stops at its first failed check, so a field found bad takes its default and the checks
    run again, until they pass or fail on a field `values` does not set: one call names them all. A config that
    raises a plain `ValueError` ("<field> must ...") is read the same way; one naming no field is filed under "".

    >>> from reward_models.finetune.dpo import DPOConfig
    >>> sorted(config_errors(DPOConfig, {"policy_path": "p", "data_path": "d", "beta": 0, "max_steps": -1}))
    ['beta', 'max_steps']
    """
    known = {f.name for f in fields(cls)}
    unknown = f"unknown setting; the settings are {', '.join(sorted(known))}"
    errors = {name: unknown for name in values if name not in known}
    hints = typing.get_type_hints(cls)
    checked = {}
    for name, value in values.items():
        if name in known:
            try:
                checked[name] = _checked_value(name, value, hints[name])
            except ConfigError as exc:
                errors[name] = exc.reason
    while True:
        try:
            cls(**checked)
            return errors
        except ConfigError as exc:
            name, reason = exc.field, exc.reason
        except ValueError as exc:  # a config that checks itself without `require`: "<field> must be ..."
            name = next((name for name in known if str(exc).startswith(f"{name} ")), "")
            reason = str(exc).removeprefix(f"{name} ")
        errors.setdefault(name, reason)
        if name not in checked:
            return errors
        del checked[name]


def _checked_value(name: str, value: Any, hint: Any) -> Any:
    allowed = allowed_types(hint)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(name, "must not be empty")
    if bool in allowed and isinstance(value, bool):
        return value
    if isinstance(value, bool):
        raise ConfigError(name, f"must be {type_names(allowed)}, not true/false")
    if float in allowed and isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ConfigError(name, "must be a finite number")
        return float(value)
    if int in allowed and isinstance(value, int):
        return value
    if str in allowed and isinstance(value, str):
        return value
    if list in allowed and isinstance(value, (list, tuple)):
        return list(value)
    if dict in allowed and isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return dict(value)
    raise ConfigError(name, f"must be {type_names(allowed)}, not {type(value).__name__} {value!r}")


def allowed_types(hint: Any) -> set[type]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(allowed_types(arg) for arg in typing.get_args(hint)))
    if hint is type(None):
        return {type(None)}
    if origin is not None:
        return {origin}
    return {hint}


def type_names(allowed: set[type]) -> str:
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", list: "a list"}
    names[dict] = "an object"
    return " or ".join(names.get(kind, kind.__name__) for kind in allowed if kind is not type(None))


def config_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
