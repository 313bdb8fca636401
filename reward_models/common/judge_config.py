"""`JudgeConfig`, the settings every judge-model pipeline shares; where its base model is read from (a model
directory, or a hub id found in the local Hugging Face cache, never downloaded); and `start_judge`, how each judge's
`main` begins."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reward_models.common.artifacts import finished_model
from reward_models.common.config import ConfigError, check_choices, choice, require
from reward_models.common.data import checked_rows, rows_style
from reward_models.common.reporting import Reporter, SilentReporter
from reward_models.common.runtime import resolve_precision

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
    precision: str = choice("auto", PRECISIONS, "auto, fp32, bf16 or fp16 (auto: bf16 on a GPU that has it).")
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
        check_choices(self)


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


@dataclass(frozen=True)
class JudgeStart:
    """How a judge's run begins. `finished` is the stored summary when `output_dir` already holds the finished model
    (the run returns it and reads nothing else); otherwise `precision` is the one the run trains in, `local` the
    config (of the judge's own class) with its base model resolved to a local directory, `rows` the training
    data, checked; `style` reads theirs (`rows_style`, which refuses a mix of text and conversational rows) for
    the judges that encode a whole data set in one style."""

    reporter: Reporter
    finished: dict[str, Any] | None = None
    precision: str = ""
    local: Any = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def style(self) -> str:
        return rows_style(self.rows)


def start_judge(
    config: JudgeConfig,
    kind: str,
    noun: str,
    problems: Callable[[list[dict[str, Any]], Any], Mapping[int, str]],
    reporter: Reporter | None,
) -> JudgeStart:
    """The first steps every judge's `main` takes, cheapest first: a model already finished in `output_dir` is
    returned as it is; then the precision is resolved (one this machine cannot train in is refused), the base model
    is found locally, and the rows are read and checked with `problems`, so that a bad setting, a missing model or
    a malformed row stops the run before any training."""
    reporter = reporter or SilentReporter()
    if (finished := finished_model(config, kind, reporter, noun)) is not None:
        return JudgeStart(reporter, finished=finished)
    precision = resolve_precision(config.precision)
    local = with_local_base(config)  # a hub id read from the local cache
    rows = checked_rows(config, problems)
    return JudgeStart(reporter, precision=precision, local=local, rows=rows)
