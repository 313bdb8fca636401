"""Typed readers for settings that come from the environment.

Each helper raises ImproperlyConfigured naming the variable, so a bad value stops start-up with a message an
operator can act on instead of a traceback from deep inside Django.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfigured(f"{name} is required but not set.")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false, 1/0, yes/no, on/off), got {value!r}.")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}.")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    if value is None:
        return default
    if not value.strip():
        raise ImproperlyConfigured(f"{name} must be a directory path, got an empty string.")
    return Path(value).expanduser().resolve()


def env_path_list(name: str) -> list[Path]:
    """Comma-separated absolute directory paths; unset or empty gives none."""
    paths = []
    for item in env_list(name, []):
        path = Path(item).expanduser()
        if not path.is_absolute():
            raise ImproperlyConfigured(f"{name} must list absolute paths, got {item!r}.")
        paths.append(path.resolve())
    return paths
