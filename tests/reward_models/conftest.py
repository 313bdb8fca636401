"""Shared fixtures for reward_models tests: one short bootstrap run gives a small trained policy directory.

These tests need no Django and no network; everything is built from configs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from reward_models.envs.gridworld import GridWorld  # noqa: E402
from reward_models.policy.base import Decision  # noqa: E402
from reward_models.policy.bootstrap import BootstrapConfig  # noqa: E402

# Small enough to run in a few seconds, long enough that the policy writes well-formed turns.
SHORT_BOOTSTRAP = {
    "seed": 7,
    "n_episodes": 400,
    "max_train_steps": 60,
    "warmup_steps": 5,
    "batch_size": 64,
    "eval_tasks": 16,
    "lr": 3e-3,
    # The default wall-clock budget would cut the run short on a loaded machine and make it nondeterministic.
    "max_seconds": 1800.0,
}


def _short_bootstrap_config(output_dir: Path, **overrides: Any) -> BootstrapConfig:
    return BootstrapConfig(output_dir=str(output_dir), **{**SHORT_BOOTSTRAP, **overrides})


@pytest.fixture
def short_bootstrap_config():
    """Builds a BootstrapConfig for a seconds-long run: ``short_bootstrap_config(output_dir, **overrides)``."""
    return _short_bootstrap_config


@pytest.fixture(scope="session")
def bootstrapped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A policy directory from a short bootstrap run, and the run's metrics."""
    from reward_models.policy.bootstrap import main

    output_dir = tmp_path_factory.mktemp("bootstrap") / "policy"
    metrics = main(_short_bootstrap_config(output_dir))
    return output_dir, metrics


@pytest.fixture(scope="session")
def policy_dir(bootstrapped: tuple[Path, dict[str, Any]]) -> Path:
    return bootstrapped[0]


@pytest.fixture(scope="session")
def local_policy(policy_dir: Path):
    from reward_models.policy.local import LocalCausalLMPolicy

    return LocalCausalLMPolicy(policy_dir)


class OraclePolicy:
    """A scripted policy that reads the full gridworld map from the observation: rollouts tested without a model.

    With ``wrong`` it always picks a move off every shortest path (a reliably bad policy).
    """

    history_window: int | None = 0

    def __init__(self, wrong: bool = False) -> None:
        self.wrong = wrong
        self.batch_sizes: list[int] = []

    def act(
        self, conversations: Sequence[Sequence[dict]], *, greedy: bool = True, temperature: float = 1.0, seed: int = 0
    ) -> list[Decision]:
        self.batch_sizes.append(len(conversations))
        decisions = []
        for conversation in conversations:
            rows = [row.replace(" ", "") for row in conversation[-1]["content"].split(" | ")]
            best = GridWorld().oracle({"layout": rows}).best_actions([])
            choices = [a for a in ("up", "down", "left", "right") if a not in best] if self.wrong else best
            action = choices[0]
            decisions.append(Decision(reasoning="scripted", action=action, text=f"scripted ; action {action}"))
        return decisions


@pytest.fixture
def oracle_policy() -> type[OraclePolicy]:
    return OraclePolicy


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory) -> Path:
    """An untrained tiny Llama directory whose word tokenizer covers every word of `reward_models.oracle_data`'s
    rows (gridworld turns, transcript roles, critique templates): the base model of the judge-pipeline tests."""
    from reward_models.oracle_data import build_tiny_base

    return build_tiny_base(tmp_path_factory.mktemp("base") / "tiny")
