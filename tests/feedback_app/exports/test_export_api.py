from __future__ import annotations

import hashlib
import io
import json

import pyarrow.parquet as pq
import pytest

from feedback_app.models import ApiToken, DatasetSnapshot
from tests.feedback_app.exports.helpers import as_in_jsonl, rows


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


def export_url(project, kind: str) -> str:
    return f"/api/projects/{project.pk}/exports/{kind}"


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_a_researcher_streams_a_jsonl_export(client, labelled_project, researcher):
    client.force_login(researcher)
    response = client.get(export_url(labelled_project, "preference"), {"min_agreement": "0.6"})
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"] == f'attachment; filename="{labelled_project.slug}-preference.jsonl"'
    exported = [json.loads(line) for line in body(response).decode().splitlines()]
    assert exported == rows(labelled_project, "preference", min_agreement="0.6")
    assert exported


def test_a_parquet_export_is_a_parquet_file(client, labelled_project, researcher):
    client.force_login(researcher)
    response = client.get(export_url(labelled_project, "stepwise"), {"format": "parquet", "neutral": "positive"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/vnd.apache.parquet"
    assert response["Content-Disposition"].endswith('-stepwise.parquet"')
    table = pq.read_table(io.BytesIO(body(response)))
    assert as_in_jsonl(table.to_pylist()) == rows(labelled_project, "stepwise", neutral="positive")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"min_agreement": "lots"}, "min_agreement"),
        ({"format": "csv"}, "format"),
        ({"annotators": "me"}, "annotators"),
        ({"neutral": "positive"}, "neutral"),  # stepwise only
        ({"since": "2025-04-02", "until": "2025-04-01"}, "until"),
        ({"min_agrement": "0.5"}, "min_agrement"),
    ],
)
def test_a_bad_filter_is_a_400_naming_the_field(client, project, researcher, query, field):
    client.force_login(researcher)
    response = client.get(export_url(project, "preference"), query, HTTP_ACCEPT="application/vnd.apache.parquet")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert list(response.json()) == [field]


def test_an_unknown_kind_is_a_400_listing_the_kinds(client, project, researcher):
    client.force_login(researcher)
    response = client.get(export_url(project, "pairs"))
    assert response.status_code == 400
    assert "preference" in response.json()["kind"][0]


def test_only_researchers_and_admins_may_export(client, project, annotator, outsider):
    client.force_login(annotator)
    assert client.get(export_url(project, "preference")).status_code == 403
    assert client.get(f"/api/projects/{project.pk}/snapshots").status_code == 403
    client.force_login(outsider)
    assert client.get(export_url(project, "preference")).status_code == 404
    assert client.get(f"/api/projects/{project.pk}/snapshots").status_code == 404
    assert client.get(export_url(project, "bogus-kind")).status_code == 404  # no hint before the access check
    client.logout()
    assert client.get(export_url(project, "preference")).status_code in (401, 403)


def create_snapshot(client, project, **fields):
    payload = {"name": "rm data", "export_kind": "preference", "format": "jsonl", "filters": {}, **fields}
    return client.post(f"/api/projects/{project.pk}/snapshots", payload, content_type="application/json")


def test_snapshots_are_created_listed_and_downloaded_byte_for_byte(client, labelled_project, researcher):
    client.force_login(researcher)
    created = create_snapshot(client, labelled_project, format="parquet", filters={"exclude_gold": True})
    assert created.status_code == 201, created.content
    snapshot = created.json()
    assert snapshot["format"] == "parquet"
    assert snapshot["filters"] == {"exclude_gold": True}
    assert snapshot["row_count"] == len(rows(labelled_project, "preference"))
    assert snapshot["row_ids"] and all(key.startswith("comparison:") for key in snapshot["row_ids"])

    listed = client.get(f"/api/projects/{labelled_project.pk}/snapshots").json()["results"]
    assert [item["id"] for item in listed] == [snapshot["id"]]
    assert "row_ids" not in listed[0]
    detail = client.get(f"/api/snapshots/{snapshot['id']}").json()
    assert detail["content_hash"] == snapshot["content_hash"]

    download = client.get(snapshot["download_url"])
    assert download.status_code == 200
    data = body(download)
    assert hashlib.sha256(data).hexdigest() == snapshot["content_hash"]
    assert download["ETag"] == f'"{snapshot["content_hash"]}"'
    assert download["Content-Type"] == "application/vnd.apache.parquet"
    assert pq.read_table(io.BytesIO(data)).num_rows == snapshot["row_count"]
    assert body(client.get(snapshot["download_url"])) == data


def test_a_snapshot_request_with_bad_fields_is_a_400_naming_them(client, labelled_project, researcher):
    client.force_login(researcher)
    assert create_snapshot(client, labelled_project).status_code == 201
    taken = create_snapshot(client, labelled_project)
    assert taken.status_code == 400
    assert list(taken.json()) == ["name"]
    bad_filter = create_snapshot(client, labelled_project, name="other", filters={"min_agreement": 2})
    assert bad_filter.status_code == 400
    assert list(bad_filter.json()["filters"]) == ["min_agreement"]
    wrong_kind = create_snapshot(client, labelled_project, name="other", export_kind="sft", filters={"style": "text"})
    assert wrong_kind.status_code == 400
    assert list(wrong_kind.json()["filters"]) == ["style"]
    misspelt = create_snapshot(client, labelled_project, name="other", filters={"exclude_golds": True})
    assert list(misspelt.json()["filters"]) == ["exclude_golds"]
    unknown = create_snapshot(client, labelled_project, name="other", export_kind="everything")
    assert list(unknown.json()) == ["export_kind"]
    assert DatasetSnapshot.objects.count() == 1


def test_snapshots_are_hidden_from_annotators_and_outsiders(client, labelled_project, researcher, annotator, outsider):
    client.force_login(researcher)
    snapshot = create_snapshot(client, labelled_project).json()
    client.force_login(annotator)
    assert create_snapshot(client, labelled_project, name="mine").status_code == 403
    assert client.get(f"/api/snapshots/{snapshot['id']}").status_code == 403
    assert client.get(snapshot["download_url"]).status_code == 403
    client.force_login(outsider)
    assert client.get(f"/api/snapshots/{snapshot['id']}").status_code == 404
    assert client.get(snapshot["download_url"]).status_code == 404
    assert client.get("/api/snapshots/999999").status_code == 404


def test_a_read_only_token_may_export_but_not_snapshot(client, labelled_project, researcher):
    _, key = ApiToken.issue(researcher, "notebook", read_only=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    response = client.get(export_url(labelled_project, "unpaired"), **auth)
    assert response.status_code == 200
    assert len(body(response).splitlines()) == len(rows(labelled_project, "unpaired"))
    refused = client.post(
        f"/api/projects/{labelled_project.pk}/snapshots",
        {"name": "x", "export_kind": "unpaired"},
        content_type="application/json",
        **auth,
    )
    assert refused.status_code == 403


def test_the_schema_describes_the_streamed_media_types_and_errors():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    export = schema["paths"]["/api/projects/{project_pk}/exports/{kind}"]["get"]
    assert set(export["responses"]["200"]["content"]) == {"application/x-ndjson", "application/vnd.apache.parquet"}
    assert {"400", "403", "404"} <= set(export["responses"])
    parameters = {parameter["name"] for parameter in export["parameters"]}
    assert {"format", "since", "until", "annotators", "policy_versions", "min_agreement", "exclude_gold"} <= parameters
    assert {"aggregate", "neutral", "style", "ties", "interventions", "kind", "project_pk"} <= parameters
    [kind] = [parameter for parameter in export["parameters"] if parameter["name"] == "kind"]
    assert "returns" in kind["schema"]["enum"]
    assert "`returns`" in export["description"]
    download = schema["paths"]["/api/snapshots/{snapshot_pk}/download"]["get"]
    assert "application/vnd.apache.parquet" in download["responses"]["200"]["content"]
    assert "post" in schema["paths"]["/api/projects/{project_pk}/snapshots"]


def test_the_new_kind_and_options_go_through_the_api(client, labelled_project, researcher, annotator):
    client.force_login(researcher)
    returns = client.get(export_url(labelled_project, "returns"), {"format": "parquet"})
    assert returns.status_code == 200
    assert returns["Content-Disposition"].endswith('-returns.parquet"')
    assert as_in_jsonl(pq.read_table(io.BytesIO(body(returns))).to_pylist()) == rows(labelled_project, "returns")
    with_ties = client.get(export_url(labelled_project, "preference"), {"ties": "include"})
    exported = [json.loads(line) for line in body(with_ties).decode().splitlines()]
    assert exported == rows(labelled_project, "preference", ties="include")
    assert any(row["tie"] for row in exported)
    labels_only = client.get(export_url(labelled_project, "stepwise"), {"interventions": "exclude"})
    assert {json.loads(line)["source"] for line in body(labels_only).decode().splitlines()} == {"label"}

    refused = client.get(export_url(labelled_project, "returns"), {"annotators": str(annotator.pk)})
    assert (refused.status_code, list(refused.json())) == (400, ["annotators"])
    assert list(client.get(export_url(labelled_project, "unpaired"), {"ties": "include"}).json()) == ["ties"]
    snapshot = create_snapshot(client, labelled_project, name="values", export_kind="returns")
    assert snapshot.status_code == 201
    assert all(key.startswith("trajectory:") for key in snapshot.json()["row_ids"])

    client.force_login(annotator)
    assert client.get(export_url(labelled_project, "returns")).status_code == 403
