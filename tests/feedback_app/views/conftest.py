"""Fixtures the page tests share: an annotator's logged-in client, and a stored three-step trajectory (a module that
needs another trajectory defines its own); and reading the messages a refused form shows beside its fields."""

from __future__ import annotations

import html
import re

import pytest


@pytest.fixture
def annotator_client(client, annotator):
    client.force_login(annotator)
    return client


@pytest.fixture
def trajectory(make_trajectory):
    return make_trajectory(3)


def field_errors(body: str) -> list[str]:
    """The messages a form shows beside its fields, unescaped."""
    return [html.unescape(message) for message in re.findall(r'<p class="field-error">([^<]*)</p>', body)]


def assert_refused(response, message: str) -> str:
    """Assert that the form came back refused, with 400 and `message` in one of its field errors; returns the page."""
    body = response.content.decode()
    assert response.status_code == 400, response.status_code
    errors = field_errors(body)
    assert any(message in error for error in errors), errors
    return body
