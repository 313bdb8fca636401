"""POST /api/projects/{id}/preferences/import: bring existing preference labels ({prompt, chosen, rejected}, plain or
TRL's conversational format) in as tasks, imported trajectories and comparisons."""

from __future__ import annotations

import json

import pytest

from feedback_app.models import Comparison, Step, Task, Trajectory

pytestmark = pytest.mark.django_db


def _jsonl(rows: list) -> bytes:
    return ("\n".join(json.dumps(row) for row in rows) + "\n").encode()


@pytest.fixture
def post_preferences(project, researcher, api_as):
    client = api_as(researcher)

    def post(rows: list, content_type: str = "application/x-ndjson"):
        body = json.dumps(rows).encode() if content_type == "application/json" else _jsonl(rows)
        return client.generic(
            "POST", f"/api/projects/{project.pk}/preferences/import", body, content_type=content_type
        )

    return post


def _chosen_and_rejected(comparison: Comparison) -> tuple[Trajectory, Trajectory]:
    a, b = comparison.trajectory_a, comparison.trajectory_b
    return (a, b) if comparison.choice == "a" else (b, a)


def test_plain_string_rows_become_a_task_two_trajectories_and_a_comparison(project, researcher, post_preferences):
    row = {"prompt": "What colour is the sky?", "chosen": "Blue.", "rejected": "Green.", "rationale": "true"}
    response = post_preferences([row])
    assert response.status_code == 200, response.json()
    assert response.json() == {"created": 1, "skipped": 0}
    comparison = Comparison.objects.get()
    assert (comparison.annotator, comparison.query_strategy, comparison.rationale) == (researcher, "import", "true")
    assert comparison.strength == 2
    chosen, rejected = _chosen_and_rejected(comparison)
    assert (chosen.source, chosen.task_id) == ("import", rejected.task_id)
    assert [(s.observation, s.action) for s in chosen.steps.all()] == [("What colour is the sky?", "Blue.")]
    assert rejected.steps.get().action == "Green."
    assert chosen.task.instruction == "What colour is the sky?"


def test_conversational_rows_with_an_implicit_prompt_and_a_named_annotator(
    project, annotator, researcher, post_preferences
):
    user = {"role": "user", "content": "Book me a flight to Oslo."}
    row = {
        "chosen": [
            user,
            {"role": "assistant", "content": "", "tool_calls": [{"name": "search", "arguments": {"to": "OSL"}}]},
            {"role": "tool", "content": "3 flights"},
            {"role": "assistant", "content": "Booked SK123."},
        ],
        "rejected": [user, {"role": "assistant", "content": "I cannot book flights."}],
        "annotator": "annotator",
        "strength": 3,
        "external_id": "hh-1",
    }
    response = post_preferences([row], content_type="application/json")
    assert response.status_code == 200, response.json()
    comparison = Comparison.objects.get()
    assert (comparison.annotator, comparison.strength) == (annotator, 3)
    chosen, rejected = _chosen_and_rejected(comparison)
    assert chosen.external_id == "hh-1:chosen" and rejected.external_id == "hh-1:rejected"
    steps = list(chosen.steps.order_by("index"))
    assert [(s.observation, s.action) for s in steps] == [
        ("Book me a flight to Oslo.", 'search({"to": "OSL"})'),
        ("3 flights", "Booked SK123."),
    ]
    # Tandem's flat tool-call form is stored in OpenAI's shape, which chat templates read.
    assert steps[0].message["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": '{"to": "OSL"}'}}
    ]
    assert chosen.task.spec == {"prompt": [user]}


def test_rows_with_the_same_prompt_share_one_task(project, post_preferences):
    rows = [
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."},
        {"prompt": "Say hi", "chosen": "Hello!", "rejected": "..."},
    ]
    assert post_preferences(rows).json()["created"] == 2
    assert Task.objects.filter(project=project).count() == 1
    assert Trajectory.objects.count() == 4


def test_a_margin_is_kept_in_the_trajectories_metadata(project, post_preferences):
    post_preferences([{"prompt": "p", "chosen": "a", "rejected": "b", "margin": 0.7}])
    assert {t.metadata["preference_margin"] for t in Trajectory.objects.all()} == {0.7}


def test_a_retried_preference_import_stores_nothing_twice(project, post_preferences):
    rows = [
        {"prompt": "p1", "chosen": "a", "rejected": "b", "external_id": "r1"},
        {"prompt": "p2", "chosen": "c", "rejected": "d"},
    ]
    assert post_preferences(rows).json() == {"created": 2, "skipped": 0}
    assert post_preferences(rows).json() == {"created": 0, "skipped": 2}
    assert Comparison.objects.count() == 2 and Trajectory.objects.count() == 4


def test_a_bad_row_rolls_back_the_whole_file_with_each_problem_named(project, post_preferences):
    rows = [
        {"prompt": "p1", "chosen": "a", "rejected": "b"},
        {"prompt": "p2", "chosen": "c"},
        {"prompt": "p3", "chosen": "c", "rejected": "d", "annotator": "nobody"},
        {"prompt": "p4", "chosen": [{"role": "wizard", "content": "x"}], "rejected": "d"},
        {"prompt": "p5", "chosen": 5, "rejected": "d", "strength": 9},
        {"chosen": "a", "rejected": "b"},
    ]
    response = post_preferences(rows)
    assert response.status_code == 400
    errors = {(e["row"], e["field"]) for e in response.json()["errors"]}
    assert {(2, "rejected"), (3, "annotator"), (4, "chosen[0].role"), (5, "strength"), (6, "prompt")} <= errors
    assert response.json()["bad_rows"] == 5
    assert not Comparison.objects.exists() and not Trajectory.objects.exists() and not Step.objects.exists()
    assert not Task.objects.exists()


def test_an_outsider_gets_404_and_an_annotator_403(project, outsider, annotator, api_as):
    body = _jsonl([{"prompt": "p", "chosen": "a", "rejected": "b"}])
    url = f"/api/projects/{project.pk}/preferences/import"
    assert api_as(outsider).generic("POST", url, body, content_type="application/x-ndjson").status_code == 404
    assert api_as(annotator).generic("POST", url, body, content_type="application/x-ndjson").status_code == 403
    assert not Comparison.objects.exists()
