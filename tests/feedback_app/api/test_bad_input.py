"""Inputs that used to make server errors get a 400 that names the field, and nothing unstorable is stored."""

from __future__ import annotations

import base64
import json

import pytest

pytestmark = pytest.mark.django_db

HUGE = 2**63
LONE_SURROGATE_JSON = '{"instruction": "x", "spec": {"goal": "\\ud800"}}'


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.fixture
def as_researcher(api_as, researcher):
    return api_as(researcher)


def _base(project) -> str:
    return f"/api/projects/{project.pk}"


@pytest.mark.parametrize(
    "cursor",
    ["garbage", base64.b64encode(b"p=%%%&r=2").decode(), base64.b64encode(b"o=-5&p=" + b"9" * 40).decode(), "%FF"],
)
def test_a_tampered_cursor_is_a_400_or_an_empty_page(as_researcher, project, make_trajectory, cursor):
    make_trajectory(2)
    response = as_researcher.get(f"{_base(project)}/trajectories/", {"cursor": cursor})
    assert response.status_code in (400, 404), response.content
    assert "cursor" in response.content.decode().lower()


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("tasks/", "seed"),
        ("trajectories/", "task"),
        ("runs/", "base_policy"),
        ("assignments/", "annotator"),
        ("policy-versions/", "parent"),
        ("comparisons/", "trajectory"),
    ],
)
@pytest.mark.parametrize("value", [str(HUGE), str(-HUGE - 1), "1e400", "²"])
def test_integer_filters_out_of_range_are_a_400_naming_the_filter(as_researcher, project, path, name, value):
    response = as_researcher.get(f"{_base(project)}/{path}", {name: value})
    assert response.status_code == 400, response.content
    assert name in response.json()


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00", "9999-12-31"])
def test_dates_at_the_calendar_edge_are_a_400_in_exports_and_snapshots(as_researcher, project, moment):
    exported = as_researcher.get(f"{_base(project)}/exports/preference", {"since": moment})
    snapshot = as_researcher.post(
        f"{_base(project)}/snapshots", {"name": "edge", "kind": "preference", "filters": {"until": moment}}
    )
    for response in (exported, snapshot):
        assert response.status_code in (200, 201, 400), response.content
    # Whichever end of the calendar: never a server error, and a refused moment is named.
    if exported.status_code == 400:
        assert "since" in exported.json()
    huge = as_researcher.get(f"{_base(project)}/exports/preference", {"annotators": str(HUGE)})
    assert huge.status_code == 400 and "annotators" in huge.json()


@pytest.mark.parametrize("path", ["trajectories/", "interventions/", "comparisons/"])
@pytest.mark.parametrize(
    ("moment", "status"),
    [("0022-08-15T03:20:49.8+23:35", 200), ("2025-03-01T12:00-23:59", 200), ("0001-01-01T00:00:00+05:00", 400)],
)
def test_list_date_filters_take_any_iso_offset_and_refuse_moments_before_the_calendar(
    as_researcher, project, path, moment, status
):
    # PostgreSQL refuses offsets beyond 15:59: the filters send every moment in UTC.
    response = as_researcher.get(f"{_base(project)}/{path}", {"created_before": moment, "created_after": moment})
    assert response.status_code == status, response.content
    if status == 400:
        assert "created_before" in response.json() and "created_after" in response.json()


def test_a_lone_surrogate_in_a_json_field_is_refused_and_nothing_is_stored(as_researcher, project):
    response = as_researcher.post(f"{_base(project)}/tasks/", LONE_SURROGATE_JSON, content_type="application/json")
    assert response.status_code == 400
    assert "spec.goal" in response.json()
    assert "surrogate" in json.dumps(response.json())
    assert project.tasks.count() == 0
    assert as_researcher.get(f"{_base(project)}/tasks/").status_code == 200


def test_nul_in_text_is_refused(as_researcher, project):
    body = json.dumps({"instruction": "go\u0000", "spec": {}})
    response = as_researcher.post(f"{_base(project)}/tasks/", body, content_type="application/json")
    assert response.status_code == 400 and "instruction" in response.json()


def test_json_nested_a_thousand_levels_is_a_400(as_researcher, project):
    body = '{"instruction": "x", "spec": {"a": ' + _deep(1000) + "}}"
    response = as_researcher.post(f"{_base(project)}/tasks/", body, content_type="application/json")
    assert response.status_code == 400
    body = '{"instruction": "x", "spec": {"a": ' + _deep(100) + "}}"
    response = as_researcher.post(f"{_base(project)}/tasks/", body, content_type="application/json")
    assert response.status_code == 400 and "nested" in json.dumps(response.json())


def test_a_json_array_as_the_body_of_a_run_launch_is_a_400(as_researcher, project):
    response = as_researcher.post(f"{_base(project)}/runs/", "[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert response.json()


def test_a_multipart_null_for_a_json_field_is_a_400(api_as, researcher, project):
    client = api_as(researcher)
    response = client.post(f"{_base(project)}/tasks/", {"instruction": "x", "spec": "null"}, format="multipart")
    assert response.status_code in (201, 400), response.content
    if response.status_code == 201:
        assert response.json()["spec"] is not None
    response = client.post(f"{_base(project)}/runs/", {"kind": "rollout", "config": "null"}, format="multipart")
    assert response.status_code == 400


def test_an_import_seed_past_64_bits_is_a_row_error(as_researcher, project):
    row = {"task": {"instruction": "x", "seed": HUGE}, "steps": [{"observation": "o", "action": "a"}]}
    response = as_researcher.post(
        f"{_base(project)}/trajectories/import", json.dumps([row]), content_type="application/json"
    )
    assert response.status_code == 400
    assert "seed" in json.dumps(response.json())
    assert project.tasks.count() == 0


def test_a_nul_in_a_preference_import_is_refused(as_researcher, project):
    row = {
        "prompt": [{"role": "user", "content": "hi\u0000"}],
        "chosen": [{"role": "assistant", "content": "a"}],
        "rejected": [{"role": "assistant", "content": "b"}],
    }
    response = as_researcher.post(
        f"{_base(project)}/preferences/import", json.dumps([row]), content_type="application/json"
    )
    assert response.status_code == 400
    assert "NUL" in json.dumps(response.json())


def test_a_lone_surrogate_in_an_import_is_a_row_error(as_researcher, project):
    body = (
        '[{"task": {"instruction": "x"}, "metadata": {"k": "\\udc00"}, '
        '"steps": [{"observation": "o", "action": "a"}]}]'
    )
    response = as_researcher.post(f"{_base(project)}/trajectories/import", body, content_type="application/json")
    assert response.status_code == 400
    assert "metadata.k" in json.dumps(response.json())


def test_api_404s_are_json(as_researcher, project):
    for path in (f"{_base(project)}/tasks/%F1%BB/", "/api/no-such-thing/", f"{_base(project)}/tasks/99999/"):
        response = as_researcher.get(path)
        assert response.status_code == 404
        assert response["Content-Type"].startswith("application/json")
        assert "detail" in response.json()


def test_a_trajectory_past_the_step_or_byte_limit_is_refused(as_researcher, project, settings):
    settings.TANDEM_MAX_TRAJECTORY_STEPS = 5
    settings.TANDEM_MAX_TRAJECTORY_BYTES = 2000
    url = f"{_base(project)}/trajectories/import"
    long = {"external_id": "long", "task": {"instruction": "x"}, "steps": [{"observation": "o", "action": "a"}] * 6}
    big = {"external_id": "big", "task": {"instruction": "x"}, "steps": [{"observation": "o" * 3000, "action": "a"}]}
    for row, words in ((long, "TANDEM_MAX_TRAJECTORY_STEPS"), (big, "TANDEM_MAX_TRAJECTORY_BYTES")):
        response = as_researcher.post(url, json.dumps([row]), content_type="application/json")
        assert response.status_code == 400
        assert words in json.dumps(response.json())
        single = as_researcher.post(f"{_base(project)}/trajectories/", row, format="json")
        assert single.status_code == 400 and words in json.dumps(single.json())
    assert project.trajectories.count() == 0
    fits = {"external_id": "fits", "task": {"instruction": "x"}, "steps": [{"observation": "o", "action": "a"}] * 5}
    stored = as_researcher.post(url, json.dumps([fits]), content_type="application/json")
    assert stored.status_code == 200 and stored.json()["created"] == 1


def test_hidden_fields_are_not_required_in_the_schema(as_researcher):
    schema = as_researcher.get("/api/schema/?format=json").json()
    step = schema["components"]["schemas"]["TrajectoryStep"]
    assert "env_reward" in step["properties"]
    assert "env_reward" not in step.get("required", [])
