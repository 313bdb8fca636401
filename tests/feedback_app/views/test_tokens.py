"""The API tokens page: list my tokens, make one (key shown once), revoke one."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from feedback_app.models import ApiToken

pytestmark = pytest.mark.django_db


def _key_in(html: str) -> str:
    match = re.search(r'id="new-token-key">([^<]+)<', html)
    assert match, "the new key is not on the page"
    return match.group(1)


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(reverse("api-tokens"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_a_new_token_key_is_shown_once_and_works_against_the_api(client, project, researcher, task):
    client.force_login(researcher)
    response = client.post(reverse("api-tokens"), {"name": "eval notebook"})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    key = _key_in(response.content.decode())
    token = ApiToken.objects.get(user=researcher)
    assert (token.name, token.read_only, key.startswith(token.prefix)) == ("eval notebook", False, True)

    listing = client.get(reverse("api-tokens")).content.decode()
    assert "eval notebook" in listing and key not in listing and 'id="new-token-key"' not in listing

    api = Client()
    answer = api.get(f"/api/projects/{project.pk}/tasks/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 200 and answer.json()["results"][0]["id"] == task.pk


def test_a_read_only_token_is_made_from_the_checkbox(client, researcher):
    client.force_login(researcher)
    client.post(reverse("api-tokens"), {"name": "dashboards", "read_only": "on"})
    assert ApiToken.objects.get(user=researcher).read_only is True


def test_a_token_needs_a_name(client, researcher):
    client.force_login(researcher)
    response = client.post(reverse("api-tokens"), {"name": ""})
    assert response.status_code == 400 and "This field is required." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_the_page_lists_only_my_tokens(client, researcher, annotator):
    ApiToken.issue(annotator, "someone else's")
    ApiToken.issue(researcher, "mine")
    client.force_login(researcher)
    html = client.get(reverse("api-tokens")).content.decode()
    assert "mine" in html and "someone else" not in html


def test_revoking_a_token_stops_it_working(client, project, researcher):
    token, key = ApiToken.issue(researcher, "ci")
    client.force_login(researcher)
    response = client.post(reverse("api-token-revoke", args=[token.pk]))
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert "revoked" in client.get(reverse("api-tokens")).content.decode()
    assert Client().get(f"/api/projects/{project.pk}/tasks/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 401


def test_nobody_revokes_another_users_token(client, researcher, annotator):
    token, _ = ApiToken.issue(annotator, "theirs")
    client.force_login(researcher)
    assert client.post(reverse("api-token-revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.is_active


def test_revoking_needs_post_and_a_csrf_token(researcher):
    token, _ = ApiToken.issue(researcher, "ci")
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)
    assert client.get(reverse("api-token-revoke", args=[token.pk])).status_code == 405
    assert client.post(reverse("api-token-revoke", args=[token.pk])).status_code == 403
    token.refresh_from_db()
    assert token.is_active


def test_the_navigation_links_to_the_tokens_page(client, researcher):
    client.force_login(researcher)
    assert f'href="{reverse("api-tokens")}"' in client.get(reverse("home")).content.decode()
