"""The trained policy's directory: a finished run found again instead of training twice, and the trained policy
written with its settings and manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import ARTIFACT_MANIFEST, finished_model, write_manifest
from reward_models.common.cli import first_process
from reward_models.common.reporting import Reporter
from reward_models.finetune.config import PolicyTrainConfig
from reward_models.policy.model import save_policy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def finished_policy(config: PolicyTrainConfig, kind: str, reporter: Reporter) -> dict[str, Any] | None:
    """The stored summary when `config.output_dir` already holds a finished policy of `kind` (and says so through
    `reporter`), else None: a trainer returns it instead of training again."""
    return finished_model(config, kind, reporter, "policy")


def save_trained_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    settings: dict[str, Any],
    config: PolicyTrainConfig,
    *,
    kind: str,
    metrics: dict[str, Any],
    summary: dict[str, Any],
) -> Path:
    """Write the trained policy into `config.output_dir`: an ordinary Hugging Face directory (LoRA adapters merged)
    with `tandem_policy.json` (the starting policy's history window and token budget) and the manifest, which is
    written last, so its presence means the directory is complete. Under `torchrun` or `accelerate launch` only the
    first process writes (every process holds the same weights); the others return the manifest's path at once."""
    path = Path(config.output_dir) / ARTIFACT_MANIFEST
    if not first_process():
        return path
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    save_policy(
        model,
        tokenizer,
        config.output_dir,
        history_window=settings["history_window"],
        max_new_tokens=settings["max_new_tokens"],
    )
    return write_manifest(
        config.output_dir, kind=kind, config=config, metrics=metrics, summary=summary, base_model=config.policy_path
    )
