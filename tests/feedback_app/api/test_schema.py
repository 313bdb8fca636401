"""The OpenAPI document is valid, describes every API route with its errors, and the docs pages use only our own
static files."""

from __future__ import annotations

import re

import pytest
from drf_spectacular.validation import validate_schema

from tests.feedback_app.api.routes import api_path, api_routes

pytestmark = pytest.mark.django_db

DOCS_ROUTES = {"/api/schema/", "/api/docs/", "/api/redoc/"}


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    from drf_spectacular.generators import SchemaGenerator

    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)


def _openapi_paths() -> set[str]:
    """Every URL pattern under /api/, written the way OpenAPI writes paths (/api/projects/{project_pk}/)."""
    # drf-spectacular names a detail route's pk "id".
    return {api_path(route, r"{\1}").replace("{pk}", "{id}") for route in api_routes()}


def test_the_schema_served_at_api_schema_is_valid_openapi(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    document = response.json()
    validate_schema(document)
    assert document["info"]["title"] == "Tandem API"


def test_schema_generation_gives_no_warnings(capsys):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")
    assert "Warning" not in capsys.readouterr().err


def test_every_api_url_pattern_appears_in_the_schema(schema):
    routes = _openapi_paths()
    assert "/api/projects/{project_pk}/trajectories/import" in routes
    missing = routes - DOCS_ROUTES - set(schema["paths"])
    assert missing == set()


def test_every_operation_describes_its_errors(schema):
    for path, operations in schema["paths"].items():
        if path in DOCS_ROUTES:
            continue
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"401", "403", "429"} <= codes, (method, path, codes)
            if "{" in path:
                assert "404" in codes, (method, path)
            if method in ("post", "put", "patch"):
                assert "400" in codes, (method, path)


def test_the_import_endpoint_documents_its_formats_and_limits(schema):
    operation = schema["paths"]["/api/projects/{project_pk}/trajectories/import"]["post"]
    assert set(operation["requestBody"]["content"]) == {
        "application/json",
        "application/x-ndjson",
        "application/jsonl",
    }
    assert {"400", "413", "415"} <= set(operation["responses"])


def test_the_token_scheme_is_documented(schema):
    schemes = schema["components"]["securitySchemes"]
    assert schemes["tokenAuth"]["scheme"] == "bearer"
    assert "cookieAuth" in schemes


@pytest.mark.parametrize("url", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_load_only_our_own_static_files(client, url):
    response = client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert sources, "the page loads no scripts or styles?"
    for source in sources:
        assert not re.match(r"^(https?:)?//", source), source
        assert source.startswith("/static/") or source.startswith("/api/"), source
    assert "cdn" not in html.lower()
    assert "drf_spectacular_sidecar" in html
    if url == "/api/docs/":
        # Swagger UI's settings come from a script of our own (no inline script under the CSP).
        script = client.get(next(s for s in sources if s.startswith("/api/docs/"))).content.decode()
        assert '"validatorUrl": null' in script  # no badge fetched from validator.swagger.io
    static_file = next(s for s in sources if s.endswith(".js"))
    assert client.get(static_file).status_code == 200
