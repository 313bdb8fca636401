"""Fixtures the web app's tests share."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


@pytest.fixture
def api_as():
    """api_as(user) -> an APIClient logged in as `user` (session authentication)."""

    def make(user) -> APIClient:
        client = APIClient()
        client.default_format = "json"
        client.force_login(user)
        return client

    return make
