"""Launching judge-model runs through the API, watching them, and finding the result in the model registry."""

from __future__ import annotations

import pytest

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.imports import import_preference_stream
from feedback_app.models import RunStatus, TrainingRun
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows
from training.judges import run_judge
from training.runs import execute_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]


@pytest.fixture
def snapshot(project, researcher):
    rows = preference_rows(scripted_episodes(6, per_task=3, seed=31))
    pairs = ({key: row[key] for key in ("prompt", "chosen", "rejected")} for row in rows)
    import_preference_stream(project, researcher, enumerate(pairs, 1))
    return create_snapshot(project, "preference", ExportFilters(), user=researcher, name="pairs")


def _runs_url(project) -> str:
    return f"/api/projects/{project.pk}/runs/"


def _launch(snapshot, **config) -> dict:
    return {"kind": "reward_model", "snapshot": snapshot.pk, "config": {"max_steps": 4, "batch_size": 4, **config}}


def test_a_researcher_launches_a_reward_model_and_finds_it_in_the_registry(
    api_as, project, researcher, tiny_policy, snapshot
):
    client = api_as(researcher)
    response = client.post(_runs_url(project), _launch(snapshot, name="rm-api"))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["kind"], body["status"], body["snapshot"], body["base_policy"]) == (
        "reward_model",
        "queued",
        snapshot.pk,
        tiny_policy.pk,
    )

    execute_run(body["id"], run_judge)  # what the training worker does with the message

    run = client.get(f"{_runs_url(project)}{body['id']}/").json()
    assert run["status"] == "succeeded", run["error"]
    assert run["progress_current"] == run["progress_total"] == 4
    registry = client.get(f"/api/projects/{project.pk}/models/?kind=reward_model").json()["results"]
    assert [(m["name"], m["run"], m["snapshot"], m["snapshot_hash"]) for m in registry] == [
        ("rm-api", body["id"], snapshot.pk, snapshot.content_hash)
    ]
    evaluations = client.get(f"/api/projects/{project.pk}/evaluations/?run={body['id']}").json()["results"]
    assert "accuracy" in {evaluation["name"] for evaluation in evaluations}


def test_bad_settings_are_a_400_naming_the_field_and_store_no_run(api_as, project, researcher, tiny_policy, snapshot):
    client = api_as(researcher)
    response = client.post(_runs_url(project), _launch(snapshot, batch_size=0))
    assert response.status_code == 400
    assert "config.batch_size" in response.json()
    response = client.post(_runs_url(project), {"kind": "prm", "snapshot": snapshot.pk})
    assert response.status_code == 400 and "snapshot" in response.json()
    response = client.post(_runs_url(project), {"kind": "reward_model", "snapshot": 999_999})
    assert response.status_code == 400 and "snapshot" in response.json()
    assert not TrainingRun.objects.exists()


def test_only_researchers_with_a_writable_credential_launch(
    api_as, token_client, project, annotator, outsider, researcher, tiny_policy, snapshot
):
    assert api_as(annotator).post(_runs_url(project), _launch(snapshot)).status_code == 403
    assert api_as(outsider).post(_runs_url(project), _launch(snapshot)).status_code == 404
    assert token_client(researcher, read_only=True).post(_runs_url(project), _launch(snapshot)).status_code == 403
    assert api_as(annotator).get(f"/api/projects/{project.pk}/models/").status_code == 403
    assert api_as(outsider).get(f"/api/projects/{project.pk}/models/").status_code == 404
    assert not TrainingRun.objects.exists()


def test_a_queued_judge_run_is_cancelled_through_the_api(api_as, project, researcher, tiny_policy, snapshot):
    client = api_as(researcher)
    run_id = client.post(_runs_url(project), _launch(snapshot)).json()["id"]
    response = client.post(f"{_runs_url(project)}{run_id}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert execute_run(run_id, run_judge) is None  # the message arrives later and does nothing
    assert TrainingRun.objects.get(pk=run_id).status == RunStatus.CANCELLED
