"""Fixtures the page tests share: an annotator's logged-in client, and a stored three-step trajectory (a module that
needs another trajectory defines its own)."""

from __future__ import annotations

import pytest


@pytest.fixture
def annotator_client(client, annotator):
    client.force_login(annotator)
    return client


@pytest.fixture
def trajectory(make_trajectory):
    return make_trajectory(3)
