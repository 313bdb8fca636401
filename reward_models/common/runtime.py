"""Devices and precision for training: resolving ``auto`` precision on this machine, the matching `Trainer`
arguments, a fresh `Accelerator`, and seeding every random generator. torch is imported inside each function."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from reward_models.common.config import ConfigError


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


def lora_settings(rank: int, task_type: str = "CAUSAL_LM") -> Any:
    """peft's LoRA settings, alike in every trainer: adapters of rank `rank` with alpha twice that, on peft's default
    modules for the architecture. `task_type` says which head stays fully trainable beside them: CAUSAL_LM for a
    policy or a generative critic, SEQ_CLS for a score head, TOKEN_CLS for a head on every token."""
    from peft import LoraConfig

    return LoraConfig(task_type=task_type, r=rank, lora_alpha=2 * rank)


def trainer_precision_args(precision: str) -> dict[str, Any]:
    """The `TrainingArguments` fields for a resolved precision (TRL configs default to bf16, so always say)."""
    import torch

    return {"bf16": precision == "bf16", "fp16": precision == "fp16", "use_cpu": not torch.cuda.is_available()}


def judge_trainer_args(config: Any, precision: str, seed: int) -> dict[str, Any]:
    """The `TrainingArguments` fields a judge's transformers trainer (the reward model's, the generative critic's)
    takes from its config alike: the schedule and batch size, activation checkpointing (its name in transformers
    5), checkpoints every ``save_steps`` with the last two kept, no length cut (rows are cut to ``max_length``
    before training), no evaluation, reports or progress bars (the reporter reports), and the precision."""
    return {
        "seed": seed,
        "num_train_epochs": config.num_epochs,
        "max_steps": config.max_steps,
        "learning_rate": config.learning_rate,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "activation_checkpointing": config.gradient_checkpointing,
        "max_length": None,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": 2,
        "logging_steps": config.logging_steps,
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        **trainer_precision_args(precision),
    }


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


def timed_training(trainer: Any, resume: str | None, config: Any) -> tuple[float, int]:
    """Train a transformers `trainer` from `resume` (a checkpoint folder, or None for a fresh start). Returns the
    seconds it took and the samples this run's optimiser steps trained on every process (a resumed checkpoint's
    steps left out), counted in full batches: an epoch's last, partial batch counts as full."""
    from transformers import TrainerState

    start_step = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json")).global_step if resume else 0
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - started
    steps = trainer.state.global_step - start_step
    world = trainer.accelerator.num_processes
    return seconds, steps * config.batch_size * config.gradient_accumulation_steps * world
