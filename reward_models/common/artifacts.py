"""A run directory's checkpoints and its artifact manifest (``tandem_artifact.json``): where checkpoints go and
which one to resume from, the model as it is saved, and the manifest that marks a finished model."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reward_models.common.config import ConfigError, config_dict

ARTIFACT_MANIFEST = "tandem_artifact.json"
CHECKPOINT_DIR = "checkpoints"


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


def finished_model(config: Any, kind: str, reporter: Any, noun: str = "model") -> dict[str, Any] | None:
    """`finished_summary`, said through `reporter` (a `reporting.Reporter`) when there is one: a pipeline returns it
    instead of training again."""
    finished = finished_summary(config, kind)
    if finished is not None:
        reporter.log(f"{config.output_dir} already holds this {noun}; not training again")
    return finished
