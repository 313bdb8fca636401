"""Personal API tokens: Bearer or Token header, hashed keys, revocation, read-only tokens, last_used_at."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from feedback_app.models import ApiToken, Task
from tests.feedback_app.api.routes import api_path, api_routes

pytestmark = pytest.mark.django_db


def _projects_url(project) -> str:
    return f"/api/projects/{project.pk}/tasks/"


@pytest.mark.parametrize("keyword", ["Bearer", "Token", "bearer"])
def test_a_token_acts_as_its_user_with_either_keyword(project, researcher, task, token_client, keyword):
    response = token_client(researcher, keyword=keyword).get(_projects_url(project))
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["results"]] == [task.pk]


def test_without_credentials_the_api_answers_401_with_a_bearer_challenge(project):
    response = APIClient().get(_projects_url(project))
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_key_gets_401(project):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer tdm_not-a-real-key")
    response = client.get(_projects_url(project))
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid API token."


def test_a_malformed_authorization_header_gets_401(project):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer two parts")
    assert client.get(_projects_url(project)).status_code == 401


def test_a_revoked_token_gets_401(project, researcher):
    token, key = ApiToken.issue(researcher, "ci")
    token.revoke()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    response = client.get(_projects_url(project))
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]


def test_a_token_of_an_inactive_user_gets_401(project, researcher):
    _, key = ApiToken.issue(researcher, "ci")
    researcher.is_active = False
    researcher.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get(_projects_url(project)).status_code == 401


def test_only_the_hash_of_the_key_is_stored(researcher):
    token, key = ApiToken.issue(researcher, "ci")
    stored = ApiToken.objects.filter(pk=token.pk).values()[0]
    assert key not in {str(value) for value in stored.values()}


def test_last_used_at_is_written_at_most_once_a_minute(project, researcher):
    token, key = ApiToken.issue(researcher, "ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.get(_projects_url(project))
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    client.get(_projects_url(project))
    token.refresh_from_db()
    assert token.last_used_at == first

    earlier = timezone.now() - timedelta(minutes=2)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=earlier)
    client.get(_projects_url(project))
    token.refresh_from_db()
    assert token.last_used_at > earlier + timedelta(minutes=1)


def test_a_read_only_token_may_read(project, researcher, task, token_client):
    assert token_client(researcher, read_only=True).get(_projects_url(project)).status_code == 200


def test_a_read_only_token_may_not_write_and_is_told_why(project, researcher, token_client):
    response = token_client(researcher, read_only=True).post(
        _projects_url(project), {"instruction": "new task"}, format="json"
    )
    assert response.status_code == 403
    assert "read-only" in response.json()["detail"]
    assert not Task.objects.filter(instruction="new task").exists()


def test_a_full_token_may_write_where_the_role_allows(project, researcher, token_client):
    response = token_client(researcher).post(_projects_url(project), {"instruction": "new task"}, format="json")
    assert response.status_code == 201
    assert Task.objects.filter(project=project, instruction="new task").exists()


def test_a_read_only_token_is_refused_on_every_unsafe_api_route(project, researcher, admin_member, token_client):
    clients = {user: token_client(user, read_only=True) for user in (researcher, admin_member)}
    routes = api_routes()
    assert any("import" in route for route in routes)
    refused = set()
    for route in routes:
        path = api_path(route, lambda m: str(project.pk))
        for client in clients.values():
            for method in ("post", "put", "patch", "delete"):
                response = getattr(client, method)(path, {}, format="json")
                # 405: the route has no such method at all (the schema and docs pages only answer GET).
                assert response.status_code in (403, 405), (method, path, response.status_code)
                if response.status_code == 403:
                    refused.add(route)
    assert len(refused) >= len(routes) - 3  # all but /api/schema/, /api/docs/ and /api/redoc/
