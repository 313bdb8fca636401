"""The `python -m reward_models.<pipeline>` command line: flags made from a config dataclass's fields, checked
like a stored config, and the entry that trains with a console reporter and prints the summary."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from reward_models.common.config import C, ConfigError, allowed_types, config_from_dict, type_names
from reward_models.common.reporting import ConsoleReporter, SilentReporter


def parse_cli(cls: type[C], argv: Sequence[str] | None = None, description: str | None = None) -> C:
    """Flags from the dataclass fields (`--name value`; booleans take true/false), checked like a stored config."""
    parser = argparse.ArgumentParser(description=description)
    hints = typing.get_type_hints(cls)
    for config_field in fields(cls):
        default = _default(config_field)
        allowed = allowed_types(hints[config_field.name])
        help_text = config_field.metadata.get("help", "")
        if default is not dataclasses.MISSING:
            help_text = f"{help_text} (default: {default})"
        parser.add_argument(
            f"--{config_field.name}",
            type=_cli_parser(config_field.name, allowed),
            default=argparse.SUPPRESS,
            required=default is dataclasses.MISSING,
            help=help_text.replace("%", "%%"),  # argparse %-formats help: "30 % slower" printed its own state
        )
    namespace = vars(parser.parse_args(argv))
    try:
        return config_from_dict(cls, namespace)
    except ConfigError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _default(config_field: dataclasses.Field) -> Any:
    if config_field.default is not dataclasses.MISSING:
        return config_field.default
    if config_field.default_factory is not dataclasses.MISSING:
        return config_field.default_factory()
    return dataclasses.MISSING


def _cli_parser(name: str, allowed: set[type]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if type(None) in allowed and text.lower() in ("none", "null", ""):
            return None
        if bool in allowed:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise argparse.ArgumentTypeError(f"{name}: expected true or false, got {text!r}")
        if list in allowed:
            return json.loads(text) if text.startswith("[") else [part for part in text.split(",") if part]
        if dict in allowed:
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise argparse.ArgumentTypeError(f"{name}: expected a JSON object, got {text!r}") from exc
        for kind in (int, float):
            if kind in allowed:
                try:
                    return kind(text)
                except ValueError:
                    if float in allowed and kind is int:
                        continue
                    raise argparse.ArgumentTypeError(f"{name}: expected {type_names({kind})}, got {text!r}") from None
        return text

    return parse


def first_process() -> bool:
    """Whether this is the first process of an `accelerate launch` or `torchrun` launch (or the only process)."""
    return os.environ.get("RANK", "0") == "0"


def cli(cls: type[C], main: Callable[..., dict[str, Any]], description: str | None = None, argv=None) -> None:
    """The `python -m reward_models.<pipeline>` entry: parse flags, train with a console reporter, print the
    summary as JSON on stdout. Under `accelerate launch` or `torchrun` only the first process reports and prints."""
    config = parse_cli(cls, argv, (description or "").split("\n\n")[0] or None)
    first = first_process()
    summary = main(config, ConsoleReporter() if first else SilentReporter())
    if first:
        print(json.dumps(summary, indent=2, default=str))
