"""What the policy trainers on exported rows (`sft`, `kto`, `dpo`) share: how a run begins (a finished policy found
again, or the seed set, the rows read and the starting policy loaded), the starting policy's evaluation and the
training clock, a TRL trainer's callbacks and run, and how the run ends (the trained policy evaluated against the
starting one and written with its summary and manifest, and the checkpoints removed).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import checkpoint_dir, trained_model
from reward_models.common.data import read_rows
from reward_models.common.reporting import Reporter, SilentReporter, trainer_callback
from reward_models.common.runtime import seed_everything
from reward_models.finetune.artifacts import finished_policy, save_trained_policy
from reward_models.finetune.config import PolicyTrainConfig
from reward_models.finetune.evaluation import evaluate_base, final_metrics
from reward_models.finetune.policy_model import PolicyModel, load_policy_model
from reward_models.finetune.trl_runs import train_with_resume, trainer_time_limit

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class OfflineRun:
    """One run of a trainer on exported rows (`start_offline`). `finished` is the stored summary when `output_dir`
    already holds the finished policy (the run returns it and does nothing else); otherwise `rows` are the exported
    rows and `policy` the starting policy. `base` (the starting policy's held-out figures) and `started` (the
    training clock's start) are set by `start_training`."""

    config: PolicyTrainConfig
    kind: str
    reporter: Reporter
    finished: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    policy: PolicyModel | None = None
    base: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.policy.tokenizer

    @property
    def settings(self) -> dict[str, Any]:
        """The starting policy's ``tandem_policy.json`` settings, which the trained policy keeps."""
        return self.policy.settings

    def start_training(self) -> None:
        """Evaluate the starting policy on the held-out tasks (`evaluate_base`), then start the training clock that
        `max_seconds` and the summary's ``train_seconds`` read."""
        self.base = evaluate_base(self.policy.model, self.tokenizer, self.settings, self.config, self.reporter)
        self.started = time.monotonic()

    def trainer_callbacks(self) -> list[Any]:
        """A TRL trainer's callbacks in this run: the reporter's (progress, figures, cancelling) and the
        `max_seconds` limit."""
        return [trainer_callback(self.reporter), trainer_time_limit(self.config, self.started)]

    def train(self, trainer: Any, extra: Sequence[str] = ()) -> tuple[PreTrainedModel, dict[str, Any], str | None]:
        """Run the TRL `trainer` to its end, resuming from the run's last checkpoint (`train_with_resume`, which
        keeps the last logged value of each of `extra`): the trained model as it will be saved, the training
        figures, and the checkpoint it resumed from (None for a fresh start)."""
        training, resumed = train_with_resume(trainer, self.config, self.reporter, extra)
        return trained_model(trainer.accelerator, trainer.model), training, resumed

    def finish(
        self,
        model: PreTrainedModel,
        training: dict[str, Any],
        resumed: Any,
        *,
        extra_metrics: dict[str, Any] | None = None,
        **counts: Any,
    ) -> dict[str, Any]:
        """Evaluate the trained `model` against the starting policy (`final_metrics`, with `extra_metrics` added),
        write it with its summary and manifest into `output_dir` and remove the checkpoints; returns the summary:
        the metrics, the trainer's `counts` of what it trained on (in their order), the optimiser steps in
        `training`, the seconds since `start_training`, and the checkpoint the run `resumed` from."""
        train_seconds = time.monotonic() - self.started
        metrics = final_metrics(model, self.tokenizer, self.settings, self.config, self.base, training, self.reporter)
        metrics.update(extra_metrics or {})
        summary = {
            "metrics": metrics,
            **counts,
            "steps": training["steps"],
            "train_seconds": train_seconds,
            "output_dir": str(self.config.output_dir),
            "resumed_from": str(resumed) if resumed else None,
        }
        save_trained_policy(
            model, self.tokenizer, self.settings, self.config, kind=self.kind, metrics=metrics, summary=summary
        )
        shutil.rmtree(checkpoint_dir(self.config.output_dir), ignore_errors=True)
        return summary


def start_offline(
    config: PolicyTrainConfig, kind: str, reporter: Reporter | None, *, dropout: bool = True
) -> OfflineRun:
    """The first steps of every trainer on exported rows: a policy of `kind` already finished in `output_dir` is
    returned as it is (`finished`); otherwise the seed is set, the rows of `data_path` are read and the starting
    policy is loaded (with its dropout off unless `dropout`)."""
    reporter = reporter or SilentReporter()
    finished = finished_policy(config, kind, reporter)
    if finished is not None:
        return OfflineRun(config, kind, reporter, finished=finished)
    seed_everything(config.seed)
    rows = read_rows(config.data_path)
    policy = load_policy_model(config.policy_path, dropout=dropout)
    return OfflineRun(config, kind, reporter, rows=rows, policy=policy)
