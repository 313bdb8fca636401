"""Fixtures of the policy trainers' tests (the trained gridworld policies are in the root conftest)."""

from tests.reward_models.conftest import one_thread  # noqa: F401 (one torch thread while a module runs)
from tests.reward_models.tool_chat import tool_policy_dir  # noqa: F401 (the tiny tool-calling chat policy)
