"""Fixtures of the policy trainers' tests (the trained gridworld policies are in the root conftest)."""

import pytest
import torch

from tests.reward_models.tool_chat import tool_policy_dir  # noqa: F401 (the tiny tool-calling chat policy)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread while a module runs: two OpenMP threads on a shared, loaded 2-core machine run a tiny model
    far slower than one (under pytest-xdist every process has one thread already)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
