"""API fixtures: clients acting as the named users of tests/conftest.py, by session or by API token."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    # Throttle counts live in the cache, which outlives a test's database rollback.
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def token_client():
    """token_client(user, read_only=False) -> an APIClient sending a fresh API token as a Bearer header."""
    from feedback_app.models import ApiToken

    def make(user, read_only: bool = False, keyword: str = "Bearer") -> APIClient:
        _, key = ApiToken.issue(user, "test", read_only=read_only)
        client = APIClient()
        client.default_format = "json"
        client.credentials(HTTP_AUTHORIZATION=f"{keyword} {key}")
        return client

    return make


@pytest.fixture
def admin_member(django_user_model, project):
    from feedback_app.models import Membership

    user = django_user_model.objects.create_user(username="project-admin", password="pw-project-admin")
    Membership.objects.create(user=user, project=project, role="admin")
    return user
