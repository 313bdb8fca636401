"""The settings every policy trainer shares (`PolicyTrainConfig`, which each trainer's config extends) and
the environment they name: a fresh environment per call, and training tasks drawn clear of its held-out ones.

Nothing here imports torch: the web side builds and validates these configs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from reward_models.common.config import ConfigError, check_choices, choice, require
from reward_models.common.judge_config import PRECISIONS
from reward_models.envs.base import Environment, load_environment, training_seeds

GRIDWORLD = "reward_models.envs.gridworld.GridWorld"


@dataclass
class PolicyTrainConfig:
    """Settings every policy trainer shares. Subclasses redefine a field to change its default."""

    policy_path: str = field(default="", metadata={"help": "The policy directory to start from (Hugging Face)."})
    reference_path: str = field(
        default="", metadata={"help": "The reference policy for the KL term or DPO; empty: the starting policy."}
    )
    data_path: str = field(default="", metadata={"help": "An exported snapshot (JSONL or Parquet), for offline data."})
    output_dir: str = field(default="var/policies/trained", metadata={"help": "Where checkpoints and the policy go."})
    snapshot_hash: str = field(default="", metadata={"help": "The snapshot's content hash, kept in the manifest."})
    seed: int = field(default=0, metadata={"help": "Seeds sampling, batch order and evaluation."})
    learning_rate: float = field(default=1e-5, metadata={"help": "Peak learning rate."})
    max_steps: int = field(default=100, metadata={"help": "Optimiser steps (or iterations, for online trainers)."})
    batch_size: int = field(default=16, metadata={"help": "Examples per optimiser step."})
    save_steps: int = field(default=25, metadata={"help": "Checkpoint every this many steps (for resume)."})
    logging_steps: int = field(default=5, metadata={"help": "Record metrics every this many steps."})
    max_seconds: float = field(default=0.0, metadata={"help": "Stop training after this many seconds (0: no limit)."})
    precision: str = choice("auto", PRECISIONS, f"One of {', '.join(PRECISIONS)}; auto: bf16 on CUDA.")
    use_lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft), merged into the result."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    environment: str = field(default=GRIDWORLD, metadata={"help": "The environment class, as a dotted path."})
    environment_config: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Keyword arguments for the environment, as a JSON object."}
    )
    eval_tasks: int = field(default=200, metadata={"help": "Held-out tasks for before/after success (0: skip)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Temperature of the sampled evaluation."})
    eval_samples: int = field(
        default=1, metadata={"help": "Sampled episodes per held-out task (more: a smaller standard error)."}
    )
    generation_batch_size: int = field(
        default=256,
        metadata={
            "help": "Episodes whose turns are generated together, in rollouts and evaluation; lower it when "
            "generation runs out of memory (the KV cache grows with it)."
        },
    )
    eval_base: bool = field(
        default=True,
        metadata={"help": "Also evaluate the starting policy (off when its figures are known: a loop's last round)."},
    )

    def __post_init__(self) -> None:
        require(bool(self.policy_path), "policy_path", "is required")
        require(bool(self.output_dir), "output_dir", "is required")
        require(0 < self.learning_rate < 1, "learning_rate", "must be between 0 and 1")
        for name in ("max_steps", "batch_size", "save_steps", "logging_steps", "lora_r", "generation_batch_size"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.max_seconds >= 0, "max_seconds", "must be 0 (no limit) or positive")
        check_choices(self)
        require(self.eval_tasks >= 0, "eval_tasks", "must be 0 (skip) or positive")
        require(self.eval_temperature > 0, "eval_temperature", "must be positive")
        require(self.eval_samples > 0, "eval_samples", "must be positive")
        try:
            environment_factory(self)()
        except ValueError as exc:
            raise ConfigError("environment", str(exc)) from None

    @property
    def reference(self) -> str:
        return self.reference_path or self.policy_path


def turn_length_field() -> Any:
    """The ``max_length`` setting of a trainer on exported turns: the longest turn in tokens, a longer one losing
    the oldest history of its prompt first."""
    return field(
        default=1024, metadata={"help": "Longest turn in tokens; longer prompts lose their oldest history first."}
    )


def gradient_checkpointing_field() -> Any:
    """The ``gradient_checkpointing`` setting of a trainer that can recompute activations (`trl_runs.trl_arguments`
    passes it on to TRL), off by default."""
    return field(
        default=False, metadata={"help": "Recompute activations in the backward pass (saves memory on large models)."}
    )


def environment_factory(config: PolicyTrainConfig) -> Callable[[], Environment]:
    """A fresh environment per call (environments are stateful), as `reward_models.rollout` wants."""
    return partial(load_environment, config.environment, config.environment_config)


def train_seeds_tasks(config: PolicyTrainConfig, count: int, start: int = 0) -> list[dict[str, Any]]:
    """`count` training tasks from seed `start` up, never one of the environment's held-out evaluation tasks."""
    env = environment_factory(config)()
    return [env.make_task(seed) for seed in training_seeds(env, count, start)]
