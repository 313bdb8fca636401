"""The bench scripts' tests run pieces of them in process, tiny models included: one torch thread while a module
runs, as for the reward_models tests. The end-to-end ones drive gunicorn on PostgreSQL."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.reward_models.conftest import one_thread  # noqa: F401


@pytest.fixture
def postgres_server() -> str:
    """The PostgreSQL server of DATABASE_URL as ``scheme://user:password@host:port``, without a database: a bench
    makes and drops databases of its own there. Skips the test where DATABASE_URL is not a PostgreSQL URL."""
    url = urlsplit(os.environ.get("DATABASE_URL", ""))
    if not url.scheme.startswith("postgres"):
        pytest.skip("the bench drives gunicorn on PostgreSQL (DATABASE_URL is not a PostgreSQL URL)")
    return f"{url.scheme}://{url.netloc}"
