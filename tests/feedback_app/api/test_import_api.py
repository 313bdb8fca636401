"""POST /api/projects/{id}/trajectories/import: JSON Lines or a JSON array, streamed, validated, atomic and
idempotent, with a size limit."""

from __future__ import annotations

import io
import json

import pytest

from feedback_app import imports
from feedback_app.imports import batches, reading
from feedback_app.imports.trajectories import TrajectoryRows
from feedback_app.models import PolicyVersion, Step, Task, Trajectory
from tests.feedback_app.import_rows import as_json_lines, import_row

pytestmark = pytest.mark.django_db

JSONL = "application/x-ndjson"


@pytest.fixture
def post_import(project, researcher, api_as):
    client = api_as(researcher)

    def post(body: bytes, content_type: str = JSONL, **extra):
        return client.generic(
            "POST", f"/api/projects/{project.pk}/trajectories/import", body, content_type=content_type, **extra
        )

    return post


def test_it_imports_json_lines_and_reports_counts(project, post_import):
    response = post_import(as_json_lines([import_row("ep-1"), import_row("ep-2", task={"seed": 3})]))
    assert response.status_code == 200, response.json()
    assert response.json() == {"created": 2, "skipped": 0}
    imported = Trajectory.objects.get(external_id="ep-1")
    assert (imported.source, imported.num_steps, imported.success) == ("import", 2, True)
    assert imported.policy_version.name == "my-agent-v3" and imported.policy_version.kind == "external"
    assert list(imported.steps.order_by("index").values_list("action", flat=True)) == ["search('Oslo')", ""]
    assert Task.objects.get(project=project, seed=3).spec == {"seed": 3}


def test_it_imports_a_json_array_and_chat_style_rows(project, post_import):
    chat = {
        "external_id": "chat-1",
        "task": {"external_id": "milk"},
        "messages": [
            {"role": "system", "content": "Buy milk."},
            {"role": "user", "content": "Start."},
            {"role": "assistant", "content": "search milk"},
            {"role": "tool", "content": "2 results"},
            {"role": "assistant", "content": "buy result 1"},
        ],
    }
    response = post_import(json.dumps([import_row("ep-1"), chat], indent=2).encode(), content_type="application/json")
    assert response.status_code == 200, response.json()
    assert response.json()["created"] == 2
    steps = Trajectory.objects.get(external_id="chat-1").steps.order_by("index")
    assert [(s.observation, s.action) for s in steps] == [("Start.", "search milk"), ("2 results", "buy result 1")]


def test_a_retried_import_duplicates_nothing(project, post_import):
    body = as_json_lines([import_row("ep-1"), import_row("ep-2")])
    assert post_import(body).json() == {"created": 2, "skipped": 0}
    retried = as_json_lines([import_row("ep-1"), import_row("ep-2"), import_row("ep-3")])
    assert post_import(retried).json() == {"created": 1, "skipped": 2}
    assert Trajectory.objects.filter(project=project).count() == 3
    assert Task.objects.filter(project=project, external_id="task-1").count() == 1
    assert PolicyVersion.objects.filter(project=project, name="my-agent-v3").count() == 1


def test_one_bad_row_rolls_back_every_row_already_written(project, post_import, monkeypatch):
    # Small batches, so that good rows are written before the bad one is read and must be rolled back.
    monkeypatch.setattr(batches, "BATCH_ROWS", 2)
    stored_batches = []
    store = TrajectoryRows.store
    monkeypatch.setattr(
        TrajectoryRows,
        "store",
        lambda kind, rows, result: (stored_batches.append(len(rows)), store(kind, rows, result)),
    )
    rows = [import_row(f"ep-{i}") for i in range(7)]
    rows[5] = import_row("ep-5", steps=[{"observation": "x", "action": ""}])
    response = post_import(as_json_lines(rows))
    assert response.status_code == 400
    body = response.json()
    assert body["bad_rows"] == 1
    assert body["errors"] == [
        {"row": 6, "field": "steps[0].action", "reason": "A step needs an action or at least one tool call."}
    ]
    assert "nothing was imported" in body["detail"]
    assert stored_batches == [2, 2]  # rows 1–4 were written before row 6 was read
    assert Trajectory.objects.count() == 0 and Step.objects.count() == 0
    assert Task.objects.count() == 0 and PolicyVersion.objects.count() == 0


def test_wrong_types_are_reported_per_row_and_field(project, post_import):
    rows = [
        import_row("ep-1", steps=[{"observation": "x", "reward": "lots", "action": "go"}]),
        import_row("ep-2", task="task-1"),
        ["not", "an", "object"],
        import_row("ep-4", outcome={"success": "maybe"}),
        import_row("ep-1"),
    ]
    response = post_import(as_json_lines(rows))
    assert response.status_code == 400
    errors = {(e["row"], e["field"]): e["reason"] for e in response.json()["errors"]}
    assert errors[(1, "steps[0].reward")] == "A valid number is required."
    assert (2, "task.non_field_errors") in errors or (2, "task") in errors
    assert errors[(3, "(row)")] == "expected a JSON object, got an array"
    assert errors[(4, "outcome.success")] == "Must be a valid boolean."
    assert errors[(5, "external_id")] == "repeats row 1's 'ep-1'"
    assert response.json()["bad_rows"] == 5
    assert not Trajectory.objects.exists()


def test_malformed_json_gets_400_naming_the_line(project, post_import):
    response = post_import(
        as_json_lines([import_row("ep-1"), "", '{"external_id": "ep-2", "task": ', import_row("ep-3")])
    )
    assert response.status_code == 400
    body = response.json()
    assert body["errors"][0]["row"] == 3
    assert body["errors"][0]["reason"].startswith("malformed JSON on line 3:")
    assert "line 3" in body["detail"]
    assert not Trajectory.objects.exists()


def test_a_malformed_json_array_names_the_line(project, post_import):
    text = '[\n  {"external_id": "a", "task": {"instruction": "x"}, "steps": [{"action": "go"}]},\n  {"oops"}\n]'
    response = post_import(text.encode(), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["reason"].startswith("malformed JSON on line 3:")


def test_nan_is_refused_as_not_json(project, post_import):
    response = post_import(
        b'{"external_id": "a", "task": {"instruction": "x"}, "steps": [{"action": "go", "reward": NaN}]}'
    )
    assert response.status_code == 400
    assert "NaN is not valid JSON" in response.json()["errors"][0]["reason"]


def test_only_the_first_100_problems_are_listed(project, post_import):
    response = post_import(as_json_lines(["{bad"] * 150))
    body = response.json()
    assert response.status_code == 400
    assert (body["bad_rows"], len(body["errors"])) == (150, 100)


def test_a_body_over_the_size_limit_gets_413_before_anything_is_read(project, post_import, settings):
    settings.TANDEM_IMPORT_MAX_BYTES = 1000
    body = as_json_lines([import_row(f"ep-{i}") for i in range(10)])
    assert len(body) > 1000
    response = post_import(body)
    assert response.status_code == 413
    assert "at most 1000 bytes" in response.json()["detail"] and "TANDEM_IMPORT_MAX_BYTES" in response.json()["detail"]
    assert not Trajectory.objects.exists()


def test_the_size_limit_is_also_enforced_while_reading(project, post_import, settings):
    # A body whose declared length understates it is cut at the limit as it is read.
    settings.TANDEM_IMPORT_MAX_BYTES = 1000
    body = as_json_lines([import_row(f"ep-{i}") for i in range(10)])
    with pytest.raises(imports.BodyTooLarge):
        list(imports.iter_json_rows(io.BytesIO(body), limit=1000))
    assert len(list(imports.iter_json_rows(io.BytesIO(body), limit=len(body)))) == 10


def test_rows_split_across_read_chunks_parse_whole(monkeypatch):
    monkeypatch.setattr(reading, "CHUNK_BYTES", 7)
    rows = [import_row(f"ep-{i}") for i in range(5)]
    as_lines = list(imports.iter_json_rows(io.BytesIO(as_json_lines(rows))))
    as_array = list(imports.iter_json_rows(io.BytesIO(json.dumps(rows, indent=1).encode())))
    assert [obj for _, obj in as_lines] == rows
    assert as_array == list(enumerate(rows, start=1))


def test_an_unsupported_content_type_gets_415(project, post_import):
    response = post_import(b"external_id,task\nep-1,x\n", content_type="text/csv")
    assert response.status_code == 415
    assert "application/x-ndjson" in response.json()["detail"]


def test_an_empty_body_gets_400(project, post_import):
    response = post_import(b"")
    assert response.status_code == 400 and "empty" in response.json()["detail"]


def test_a_token_with_write_access_imports_too(project, researcher, token_client):
    response = token_client(researcher).generic(
        "POST",
        f"/api/projects/{project.pk}/trajectories/import",
        as_json_lines([import_row()]),
        content_type="application/jsonl",
    )
    assert response.status_code == 200 and response.json()["created"] == 1
