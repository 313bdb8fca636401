"""What every training pipeline in `reward_models` shares, with no Django: config checking, the command line, progress
reporting, checkpoints, devices and the artifact manifest.

A pipeline is a dataclass config and ``main(config, reporter) -> dict``. Tandem's Celery task builds the config from a
run and passes a reporter that writes progress and metrics onto the run row and raises when the run is cancelled;
``python -m reward_models.<pipeline>`` builds it from flags and prints progress to the terminal::

    @dataclass
    class RewardConfig(JudgeConfig):
        ...

    def main(config: RewardConfig, reporter: Reporter | None = None) -> dict: ...

    if __name__ == "__main__":
        cli(RewardConfig, main, __doc__)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

ARTIFACT_MANIFEST = "tandem_artifact.json"
CHECKPOINT_DIR = "checkpoints"

C = TypeVar("C")


# --- reporting ---------------------------------------------------------------------------------------------------


class Reporter(Protocol):
    """Where a pipeline reports. `progress` may raise (Tandem raises `RunCancelled` there when the run is cancelled),
    so a pipeline calls it at least once per optimiser step, and as often in any long stretch of work besides
    (evaluation, rollouts), and lets the exception through. `phase` names that other work ("evaluating the base
    policy: greedy"), which counts its own units; progress without one is training's."""

    def progress(self, current: int, total: int, phase: str = "") -> None: ...

    def metric(self, step: int, **values: float) -> None: ...

    def log(self, line: str) -> None: ...


class ConsoleReporter:
    """The command line's reporter: a progress line with an ETA every `interval` seconds, metrics and log lines on
    stderr."""

    def __init__(self, interval: float = 2.0, stream=None) -> None:
        self.interval = interval
        self.stream = stream or sys.stderr
        self._started = time.monotonic()
        self._last = 0.0

    def progress(self, current: int, total: int, phase: str = "") -> None:
        now = time.monotonic()
        if current < total and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self._started
        width = 30
        filled = int(width * current / total) if total else 0
        bar = "#" * filled + "." * (width - filled)
        if phase:
            print(f"{phase}: [{bar}] {current}/{total}", file=self.stream, flush=True)
            return
        eta = elapsed * (total - current) / current if current else float("nan")
        print(f"[{bar}] {current}/{total} elapsed {elapsed:.0f}s eta {eta:.0f}s", file=self.stream, flush=True)

    def metric(self, step: int, **values: float) -> None:
        shown = " ".join(f"{name}={value:.4g}" for name, value in values.items())
        print(f"step {step}: {shown}", file=self.stream, flush=True)

    def log(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class SilentReporter:
    """Reports nowhere; for library use and tests that do not watch progress."""

    def progress(self, current: int, total: int, phase: str = "") -> None:
        pass

    def metric(self, step: int, **values: float) -> None:
        pass

    def log(self, line: str) -> None:
        pass


def trainer_callback(reporter: Reporter):
    """A `transformers.TrainerCallback` that reports a TRL or HF `Trainer`'s progress after every optimiser step
    (so a cancel raised by the reporter stops training within one step) and its logged numbers as metrics."""
    from transformers import TrainerCallback

    class ReporterCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            reporter.progress(state.global_step, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            numbers = {
                name: float(value)
                for name, value in (logs or {}).items()
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            }
            if numbers:
                reporter.metric(state.global_step, **numbers)

    return ReporterCallback()


# --- configs -----------------------------------------------------------------------------------------------------


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
    allowed = _allowed_types(hint)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(name, "must not be empty")
    if bool in allowed and isinstance(value, bool):
        return value
    if isinstance(value, bool):
        raise ConfigError(name, f"must be {_type_names(allowed)}, not true/false")
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
    raise ConfigError(name, f"must be {_type_names(allowed)}, not {type(value).__name__} {value!r}")


def _allowed_types(hint: Any) -> set[type]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_allowed_types(arg) for arg in typing.get_args(hint)))
    if hint is type(None):
        return {type(None)}
    if origin is not None:
        return {origin}
    return {hint}


def _type_names(allowed: set[type]) -> str:
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", list: "a list"}
    names[dict] = "an object"
    return " or ".join(names.get(kind, kind.__name__) for kind in allowed if kind is not type(None))


def config_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def parse_cli(cls: type[C], argv: Sequence[str] | None = None, description: str | None = None) -> C:
    """Flags from the dataclass fields (`--name value`; booleans take true/false), checked like a stored config."""
    parser = argparse.ArgumentParser(description=description)
    hints = typing.get_type_hints(cls)
    for config_field in fields(cls):
        default = _default(config_field)
        allowed = _allowed_types(hints[config_field.name])
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
                    raise argparse.ArgumentTypeError(f"{name}: expected {_type_names({kind})}, got {text!r}") from None
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


PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass
class JudgeConfig:
    """Settings every judge-model pipeline shares. `data_path` is a snapshot file Tandem exported (JSONL or
    Parquet); `base_model` any Hugging Face model directory, loaded offline."""

    data_path: str = field(default="", metadata={"help": "The training data: an exported snapshot, JSONL or Parquet."})
    base_model: str = field(default="", metadata={"help": "A Hugging Face model directory to start from."})
    output_dir: str = field(default="var/models/judge", metadata={"help": "Where checkpoints and the model go."})
    snapshot_hash: str = field(default="", metadata={"help": "The snapshot's content hash, kept in the manifest."})
    seed: int = field(default=0, metadata={"help": "Seeds the split, initial head weights and batch order."})
    eval_fraction: float = field(
        default=0.2, metadata={"help": "Share of tasks held out for evaluation (split by task, never within one)."}
    )
    num_epochs: float = field(default=3.0, metadata={"help": "Passes over the training split."})
    max_steps: int = field(default=-1, metadata={"help": "Optimiser steps; -1 means num_epochs decides."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate."})
    batch_size: int = field(default=8, metadata={"help": "Examples per device per optimiser step."})
    max_length: int = field(default=1024, metadata={"help": "Longest tokenised example; longer ones are cut."})
    save_steps: int = field(default=50, metadata={"help": "Checkpoint every this many steps (for resume)."})
    logging_steps: int = field(default=5, metadata={"help": "Record metrics every this many steps."})
    precision: str = field(
        default="auto",
        metadata={"choices": PRECISIONS, "help": "auto, fp32, bf16 or fp16 (auto: bf16 on a GPU that has it)."},
    )
    use_lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})

    def __post_init__(self) -> None:
        require(bool(self.data_path), "data_path", "is required")
        require(bool(self.base_model), "base_model", "is required")
        require(bool(self.output_dir), "output_dir", "is required")
        require(0.0 <= self.eval_fraction < 1.0, "eval_fraction", "must be at least 0 and below 1")
        require(self.num_epochs > 0, "num_epochs", "must be positive")
        require(self.max_steps == -1 or self.max_steps > 0, "max_steps", "must be positive, or -1")
        require(0 < self.learning_rate < 1, "learning_rate", "must be between 0 and 1")
        for name in ("batch_size", "max_length", "save_steps", "logging_steps", "lora_r"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.precision in PRECISIONS, "precision", f"must be one of {', '.join(PRECISIONS)}")


# A Hugging Face hub id: "name" or "owner/name", letters, digits and -_. only, not a path that exists.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def model_directory(name: str | Path, field_name: str) -> Path:
    """The local directory of the model `name`: a model directory as it is, or a hub id ("Qwen/Qwen2.5-0.5B")
    read from the local Hugging Face cache, never downloaded. Anything else, or a hub id that is not in the cache,
    is a `ConfigError` on `field_name` that says what to do."""
    path = Path(name)
    if (path / "config.json").is_file():
        return path
    text = str(name)
    if path.exists() or not HUB_ID.fullmatch(text) or text.startswith("."):
        raise ConfigError(field_name, f"{text} is not a model directory: it has no config.json")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        cached = Path(snapshot_download(text, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ConfigError(
            field_name,
            f"{text} is neither a model directory nor a model in the local Hugging Face cache; Tandem never "
            f"downloads one: fetch it where there is network access (huggingface-cli download {text}) into the "
            "cache this machine reads (HF_HOME), or name its directory",
        ) from None
    if not (cached / "config.json").is_file():
        raise ConfigError(field_name, f"{text} is in the Hugging Face cache without a config.json: not a model")
    return cached


def with_local_base(config: JudgeConfig) -> JudgeConfig:
    """`config` with `base_model` turned into its local directory (`model_directory`), for loading; the manifest
    keeps the name the user gave."""
    return dataclasses.replace(config, base_model=str(model_directory(config.base_model, "base_model")))


# --- devices and precision ---------------------------------------------------------------------------------------


def resolve_precision(precision: str) -> str:
    """fp32, bf16 or fp16 for this machine: `auto` is bf16 on a CUDA device that supports it, else fp32. Asking
    for bf16 or fp16 without CUDA is a `ConfigError`."""
    import torch

    cuda = torch.cuda.is_available()
    if precision == "auto":
        return "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    if precision in ("bf16", "fp16") and not cuda:
        raise ConfigError("precision", f"{precision} needs a CUDA device; this machine has none (use fp32 or auto)")
    return precision


def trainer_precision_args(precision: str) -> dict[str, Any]:
    """The `TrainingArguments` fields for a resolved precision (TRL configs default to bf16, so always say)."""
    import torch

    return {"bf16": precision == "bf16", "fp16": precision == "fp16", "use_cpu": not torch.cuda.is_available()}


def fresh_accelerator(precision: str) -> Any:
    """An `Accelerator` for a resolved precision, on the GPU when there is one.

    accelerate keeps one state per process and refuses a second `Accelerator` with another precision or device,
    while a Celery worker runs one training run after another in the same process (a bf16 reward model, then an
    fp32 policy run). Like transformers' `TrainingArguments`, start from a clean state; under `torchrun` the process
    group survives the reset and is taken up again."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    return Accelerator(mixed_precision=mixed, cpu=not torch.cuda.is_available())


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --- data --------------------------------------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of an exported file, JSONL or Parquet. A missing file is a `ConfigError` on `data_path`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("data_path", f"no such file: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError("data_path", f"line {number} is not JSON: {exc.msg}") from None
    return rows


def bad_rows(rows: Sequence[dict[str, Any]], problem: Callable[[dict[str, Any]], str | None]) -> dict[int, str]:
    """The number (from 1) and reason of every row `problem` finds fault with: a trainer's own row check, which it
    runs when it loads its data and Tandem runs on a snapshot before it launches a run."""
    return {number: reason for number, row in enumerate(rows, start=1) if (reason := problem(row))}


def rows_error(problems: Mapping[int, str], total: int) -> ConfigError:
    """A `ConfigError` on `data_path` that names every bad row (`bad_rows`), grouped by reason.

    >>> str(rows_error({13: "no prompt", 20: "no prompt", 31: "empty"}, 40))
    'data_path: 3 of 40 rows cannot be used: rows 13, 20: no prompt; row 31: empty'
    """
    by_reason: dict[str, list[int]] = {}
    for number, reason in sorted(problems.items()):
        by_reason.setdefault(reason, []).append(number)
    parts = []
    for reason, numbers in by_reason.items():
        shown = ", ".join(str(number) for number in numbers[:10])
        more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
        parts.append(f"row{'s' if len(numbers) > 1 else ''} {shown}{more}: {reason}")
    return ConfigError("data_path", f"{len(problems)} of {total} rows cannot be used: {'; '.join(parts)}")


def split_by_task(
    rows: Sequence[dict[str, Any]], eval_fraction: float, seed: int, key: str = "task_id"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held out): whole tasks go to one side, so evaluation measures generalisation to unseen tasks. Rows
    without the key are split one by one. With `eval_fraction` 0 everything trains."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        group = row.get(key)
        groups.setdefault(("row", index) if group is None else ("task", group), []).append(row)
    names = sorted(groups, key=repr)
    random.Random(seed).shuffle(names)
    n_eval = round(len(names) * eval_fraction)
    if eval_fraction > 0 and len(names) > 1:
        n_eval = min(max(n_eval, 1), len(names) - 1)
    held_out = set(names[:n_eval])
    train = [row for name in names if name not in held_out for row in groups[name]]
    evaluation = [row for name in names if name in held_out for row in groups[name]]
    return train, evaluation


def row_tools(row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tool schemas a conversational row offers the agent (its ``tools`` column: a list in JSONL, JSON text in
    Parquet), in the form ``apply_chat_template(..., tools=...)`` takes them: None when it offers none."""
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools else None
    return list(tools) if tools else None


def message_text(messages: str | Sequence[Mapping[str, str]]) -> str:
    """Conversational turns as the ``Role: content`` transcript (`reward_models.policy.turns.transcript`, the form of
    the exports' `text` style and of prompts for models without a chat template); plain text is returned as it is."""
    from reward_models.policy.turns import transcript

    return messages if isinstance(messages, str) else transcript(messages)


# --- checkpoints and artifacts -----------------------------------------------------------------------------------


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


def trained_model(accelerator: Any, model: Any) -> Any:
    """`model` as it will be saved and loaded again, for the figures computed once training is over: unwrapped
    (DDP) and rid of the autocast that `accelerator.prepare` put around its forward under bf16 or fp16, so held-out
    scores match what the saved fp32 weights give. It changes `model.forward` in place: call it after training."""
    return accelerator.unwrap_model(model, keep_fp32_wrapper=False)


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete `checkpoint-N` under the run's checkpoint folder, to resume from, or None.

    The transformers `Trainer` writes `trainer_state.json` after the weights, optimiser, scheduler and RNG states,
    so a checkpoint is complete when that file is there and parses; a worker killed mid-save leaves a newer folder
    without it, which is skipped (transformers' own `get_last_checkpoint` would pick it and the resume would fail)."""
    folder = checkpoint_dir(output_dir)
    if not folder.is_dir():
        return None
    numbered = [path for path in folder.glob("checkpoint-*") if path.name.removeprefix("checkpoint-").isdigit()]
    for path in sorted(numbered, key=lambda path: int(path.name.removeprefix("checkpoint-")), reverse=True):
        if _complete_trainer_checkpoint(path):
            return str(path)
    return None


def _complete_trainer_checkpoint(path: Path) -> bool:
    try:
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def write_manifest(
    output_dir: str | Path, *, kind: str, config: Any, metrics: Mapping[str, Any], **extra: Any
) -> Path:
    """``tandem_artifact.json``: what the directory holds and where it came from (config, base model, snapshot
    hash, metrics), so the model is reproducible outside Tandem too."""
    config_values = config_dict(config) if dataclasses.is_dataclass(config) else dict(config)
    manifest = {
        "kind": kind,
        "base_model": config_values.get("base_model", ""),
        "snapshot_hash": config_values.get("snapshot_hash", ""),
        "config": config_values,
        "metrics": dict(metrics),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }
    path = Path(output_dir) / ARTIFACT_MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    # Each process writes its own partial file: where several processes of one launch write the manifest, one's
    # rename must not take the file another is about to rename (the loser failed with FileNotFoundError).
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    partial.replace(path)
    return path


def read_manifest(path: str | Path) -> dict[str, Any]:
    manifest = Path(path) / ARTIFACT_MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(f"{path} is not a Tandem model directory: it has no {ARTIFACT_MANIFEST}")
    return json.loads(manifest.read_text())


def finished_summary(config: Any, kind: str) -> dict[str, Any] | None:
    """The stored summary when `config.output_dir` already holds a finished `kind` model trained with this very
    config (so a repeated run does nothing), None when it holds none. A different finished model there is a
    `ConfigError`: it is never overwritten."""
    try:
        manifest = read_manifest(config.output_dir)
    except FileNotFoundError:
        return None
    # Compare as JSON, the form the manifest stored (tuples become lists).
    if manifest.get("kind") != kind or manifest.get("config") != json.loads(json.dumps(config_dict(config))):
        raise ConfigError(
            "output_dir", f"{config.output_dir} already holds a finished model with other settings; use a new one"
        )
    return manifest["summary"]
