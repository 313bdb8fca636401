"""Environments: the protocol (``base``) and the built-in gridworld. No torch import: the web process uses it."""

from __future__ import annotations

from reward_models.envs.base import (
    Environment,
    Oracle,
    StepResult,
    episode_success,
    load_environment,
    replay,
    training_seeds,
)
from reward_models.envs.gridworld import GridWorld

__all__ = [
    "Environment",
    "GridWorld",
    "Oracle",
    "StepResult",
    "episode_success",
    "load_environment",
    "replay",
    "training_seeds",
]
