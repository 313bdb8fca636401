"""Training a judge for the online policy trainers' tests to score with: any judge pipeline, run on a few rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulation.oracle_data import write_jsonl


def trained_judge(
    train: Callable[[Any], dict[str, Any]],
    config_class: type,
    rows: list[dict[str, Any]],
    work: Path,
    name: str,
    base_model: Path,
    **settings: Any,
) -> Path:
    """The directory of a judge that the pipeline `train` trained on every one of `rows` (none held out), from
    `base_model`, with the `config_class` `settings`: `work`/`name`, beside its rows in `work`/`name`.jsonl."""
    data = write_jsonl(rows, work / f"{name}.jsonl")
    output_dir = work / name
    train(
        config_class(
            data_path=str(data), base_model=str(base_model), output_dir=str(output_dir), eval_fraction=0.0, **settings
        )
    )
    return output_dir
