"""What a trainer built on TRL or a transformers `Trainer` shares: its common arguments, LoRA settings, the time
limit as a callback, and a run that resumes from the last checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reward_models.common.artifacts import checkpoint_dir
from reward_models.common.runtime import lora_settings
from reward_models.finetune.config import PolicyTrainConfig
from reward_models.finetune.loops import out_of_time


def trainer_time_limit(config: PolicyTrainConfig, started: float):
    """A `transformers.TrainerCallback` that stops a TRL or HF `Trainer` after the optimiser step in which
    `config.max_seconds` ran out (`out_of_time`), so `max_seconds` bounds TRL-based trainers as it bounds loops."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if out_of_time(config, started):
                control.should_training_stop = True

    return TimeLimit()


def train_with_resume(trainer: Any, config: PolicyTrainConfig, reporter: Any, extra: Sequence[str] = ()) -> tuple:
    """Run a TRL or transformers `trainer` to its end, resuming from the run's last checkpoint. Returns the loss
    summary (`steps`, `first_loss`, `last_loss`, and the last logged value of each of `extra`, e.g. ``"kl"``) and the
    checkpoint it resumed from (None for a fresh start)."""
    from reward_models.common.artifacts import last_checkpoint

    resume = last_checkpoint(config.output_dir)
    if resume:
        reporter.log(f"resuming from {resume}")
    trainer.train(resume_from_checkpoint=resume)
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    training: dict[str, Any] = {"steps": trainer.state.global_step}
    if history:
        training["first_loss"], training["last_loss"] = history[0]["loss"], history[-1]["loss"]
        for name in extra:
            if name in history[-1]:
                training[name.replace("/", "_")] = history[-1][name]
    return training, resume


def trl_arguments(config: PolicyTrainConfig, steps: int) -> dict[str, Any]:
    """The settings every TRL trainer of a policy run shares (pass them to its config class with its own): `steps`
    optimiser steps with linear decay after a 10 % warm-up, checkpoints in the run's checkpoint folder (the last two
    kept), the run's precision, no reports, no progress bars (the reporter reports), and no prompt cutting (prompts
    are cut from the left before they reach TRL)."""
    from reward_models.common.runtime import resolve_precision, trainer_precision_args

    return {
        "output_dir": str(checkpoint_dir(config.output_dir)),
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": "linear",
        "warmup_steps": math.ceil(0.1 * steps),
        "max_steps": steps,
        "per_device_train_batch_size": config.batch_size,
        "max_length": None,
        "activation_checkpointing": getattr(config, "gradient_checkpointing", False),
        "save_steps": config.save_steps,
        "save_total_limit": 2,
        "logging_steps": config.logging_steps,
        "report_to": "none",
        "disable_tqdm": True,
        "seed": config.seed,
        "dataloader_num_workers": 0,
        **trainer_precision_args(resolve_precision(config.precision)),
    }


def lora_config(config: PolicyTrainConfig) -> Any:
    """peft's LoRA settings for a policy (`lora_settings` of rank `lora_r`) when the run asks for adapters, else
    None."""
    return lora_settings(config.lora_r) if config.use_lora else None
