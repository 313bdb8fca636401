"""Error answers say no more than the status: a styled page for people, JSON under /api/, no URL patterns or
tracebacks; every response carries the Content-Security-Policy."""

from __future__ import annotations

import re

import pytest
from django.db import OperationalError
from django.test import Client
from django.urls import path

from feedback_app import urls as tandem_urls

pytestmark = pytest.mark.django_db


def boom(request):
    raise RuntimeError("a secret in a local variable")


def locked(request):
    raise OperationalError("database is locked")


urlpatterns = [
    *tandem_urls.urlpatterns,
    path("boom/", boom),
    path("api/boom/", boom),
    path("locked/", locked),
    path("api/locked/", locked),
]
handler404, handler500 = tandem_urls.handler404, tandem_urls.handler500


def test_an_anonymous_404_is_a_styled_page_without_the_url_patterns(client):
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    page = response.content.decode()
    assert "Not found" in page and "tandem.css" in page
    assert "admin/" not in page and "projects/<int" not in page and "URLconf" not in page


def test_api_errors_are_json(client, researcher):
    client.force_login(researcher)
    response = client.get("/api/projects/999999/nothing-here/")
    assert response.status_code == 404
    assert response.json() == {"detail": "There is nothing here, or it is not yours to see."}


def test_an_outsider_gets_the_same_404_page_as_for_a_missing_project(client, outsider, project):
    client.force_login(outsider)
    hidden = client.get(f"/projects/{project.pk}/")
    missing = client.get("/projects/999999/")
    assert hidden.status_code == missing.status_code == 404

    def without_csrf_token(page: bytes) -> str:  # the CSRF token is masked anew for every response
        return re.sub(r'"X-CSRFToken": "[^"]*"|name="csrfmiddlewaretoken" value="[^"]*"', "", page.decode())

    assert without_csrf_token(hidden.content) == without_csrf_token(missing.content)


@pytest.mark.urls(__name__)
def test_a_server_error_shows_no_traceback(researcher):
    client = Client(raise_request_exception=False)
    client.force_login(researcher)
    page = client.get("/boom/")
    assert page.status_code == 500
    assert "Server error" in page.content.decode() and "secret" not in page.content.decode()
    api = client.get("/api/boom/")
    assert api.status_code == 500 and api.json()["detail"].startswith("Something went wrong")


def test_an_htmx_403_swaps_in_a_fragment_not_a_page(client, annotator, project):
    client.force_login(annotator)
    response = client.get(f"/projects/{project.pk}/training/", HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    assert "<html" not in response.content.decode()
    assert 'role="alert"' in response.content.decode()


def test_every_response_carries_a_content_security_policy(client, researcher, project):
    client.force_login(researcher)
    for url in ("/", f"/projects/{project.pk}/", "/api/projects/", "/accounts/login/", "/nowhere/"):
        policy = client.get(url)["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe-eval" not in policy


@pytest.mark.urls(__name__)
def test_a_database_that_stayed_locked_answers_503_with_retry_after_not_a_server_error(researcher):
    client = Client(raise_request_exception=False)
    client.force_login(researcher)
    api = client.get("/api/locked/")
    assert api.status_code == 503 and api["Retry-After"] == "5"
    assert api.json()["detail"].startswith("The database is busy")
    page = client.get("/locked/")
    assert page.status_code == 503 and "Busy" in page.content.decode()
