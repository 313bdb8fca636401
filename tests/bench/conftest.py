"""The bench scripts' tests run pieces of them in process, tiny models included: one torch thread while a module
runs, as for the reward_models tests."""

from tests.reward_models.conftest import one_thread  # noqa: F401
