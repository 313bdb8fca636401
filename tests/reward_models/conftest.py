"""Shared fixtures for reward_models tests (the trained model directories are in the root conftest).

These tests need no Django and no network; everything is built from configs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from reward_models.envs.gridworld import GridWorld  # noqa: E402
from reward_models.policy.base import Decision, text_decision  # noqa: E402
from tests.reward_models.tool_chat import tool_policy_dir  # noqa: E402, F401 (the tiny tool-calling chat policy)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread while a module runs: the tests run in one process per core, and a second OpenMP thread in
    each, competing for the same cores, runs a tiny model far slower than one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def in_hub_cache(model_dir: Path, repo_id: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a copy of `model_dir` in a local Hugging Face cache at `cache`, as the model `repo_id` ("owner/name"),
    and point the hub's cache there for the test; returns the snapshot's directory."""
    import shutil

    from huggingface_hub import constants

    folder = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / "0123abcd"
    shutil.copytree(model_dir, snapshot)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return snapshot


class OraclePolicy:
    """A scripted policy that reads the full gridworld map from the observation: rollouts tested without a model.

    With ``wrong`` it always picks a move off every shortest path (a reliably bad policy).
    """

    history_window: int | None = 0

    def __init__(self, wrong: bool = False) -> None:
        self.wrong = wrong
        self.batch_sizes: list[int] = []

    def act(
        self,
        conversations: Sequence[Sequence[dict]],
        *,
        tools: Sequence | None = None,
        greedy: bool = True,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Decision]:
        self.batch_sizes.append(len(conversations))
        decisions = []
        for conversation in conversations:
            rows = [row.replace(" ", "") for row in conversation[-1]["content"].split(" | ")]
            best = GridWorld().oracle({"layout": rows}).best_actions([])
            choices = [a for a in ("up", "down", "left", "right") if a not in best] if self.wrong else best
            action = choices[0]
            decisions.append(text_decision(f"scripted ; action {action}"))
        return decisions


@pytest.fixture
def oracle_policy() -> type[OraclePolicy]:
    return OraclePolicy
