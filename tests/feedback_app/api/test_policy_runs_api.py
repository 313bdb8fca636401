"""Launching policy fine-tuning through the API, and finding the new version with its lineage and win rate."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.models import Comparison, PolicyVersion, TrainingRun, Trajectory
from training.policy_runs import run_policy_training
from training.runs import execute_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]


def runs_url(project) -> str:
    return f"/api/projects/{project.pk}/runs/"


def test_a_researcher_fine_tunes_a_policy_and_finds_the_child_version(
    api_as, project, researcher, tiny_policy, demonstrations
):
    snapshot = create_snapshot(project, "sft", ExportFilters(), user=researcher, name="demos")
    client = api_as(researcher)
    response = client.post(
        runs_url(project),
        {
            "kind": "sft",
            "snapshot": snapshot.pk,
            "config": {"max_steps": 3, "batch_size": 8, "eval_tasks": 2, "name": "tiny-sft"},
            "review": {"enabled": False},
        },
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["kind"], body["status"], body["base_policy"], body["snapshot"]) == (
        "sft",
        "queued",
        tiny_policy.pk,
        snapshot.pk,
    )

    execute_run(body["id"], run_policy_training)  # what the training worker does with the message

    run = client.get(f"{runs_url(project)}{body['id']}/").json()
    assert run["status"] == "succeeded", run["error"]
    versions = client.get(f"/api/projects/{project.pk}/policy-versions/?parent={tiny_policy.pk}").json()["results"]
    assert [(v["name"], v["parent"], v["produced_by"]) for v in versions] == [("tiny-sft", tiny_policy.pk, body["id"])]
    assert versions[0]["human_win_rate"]["n"] == 0
    evaluations = client.get(f"/api/projects/{project.pk}/evaluations/?run={body['id']}").json()["results"]
    assert {(e["policy_version"], e["name"], e["decoding"]) for e in evaluations} == {
        (policy, "heldout_success", decoding)
        for policy in (tiny_policy.pk, versions[0]["id"])
        for decoding in ("greedy", "sampled")
    }


def test_a_bad_launch_is_a_400_naming_each_field(api_as, project, researcher, tiny_policy):
    client = api_as(researcher)
    response = client.post(runs_url(project), {"kind": "ppo", "config": {"kl_beta": "lots"}})
    assert response.status_code == 400
    assert response.json()["config.kl_beta"] == ["must be a number, not str 'lots'"]
    response = client.post(runs_url(project), {"kind": "dpo", "review": {"num_tasks": -1}})
    assert response.status_code == 400
    assert set(response.json()) == {"snapshot", "review.num_tasks"}
    assert not TrainingRun.objects.exists()


def test_annotators_may_not_launch_policy_runs(api_as, project, annotator, tiny_policy):
    response = api_as(annotator).post(runs_url(project), {"kind": "ppo"})
    assert response.status_code == 403


def test_a_child_version_reports_the_human_win_rate_against_its_parent(
    api_as, project, researcher, annotator, tiny_policy, task
):
    child = PolicyVersion.objects.create(
        project=project, name="child", kind="local", weights_path="/w", parent=tiny_policy
    )
    for choice in ("new", "new", "old"):
        old = Trajectory.objects.create(project=project, task=task, policy_version=tiny_policy, num_steps=1)
        new = Trajectory.objects.create(project=project, task=task, policy_version=child, num_steps=1)
        Comparison.objects.create(
            project=project,
            annotator=annotator,
            trajectory_a=old,
            trajectory_b=new,
            choice="b" if choice == "new" else "a",
        )
    client = api_as(researcher)
    body = client.get(f"/api/projects/{project.pk}/policy-versions/{child.pk}/").json()
    rate = body["human_win_rate"]
    assert (rate["wins"], rate["losses"], rate["ties"], rate["n"], rate["parent"]) == (2, 1, 0, 3, tiny_policy.pk)
    assert rate["value"] == pytest.approx(2 / 3) and rate["low"] < 2 / 3 < rate["high"]
    # The list gives the same figures, every version's from one query.
    listed = {row["id"]: row for row in client.get(f"/api/projects/{project.pk}/policy-versions/").json()["results"]}
    assert listed[child.pk]["human_win_rate"] == rate and listed[tiny_policy.pk]["human_win_rate"] is None


def test_listing_versions_costs_the_same_queries_however_many_have_parents(
    api_as, project, researcher, tiny_policy, django_assert_max_num_queries
):
    client = api_as(researcher)
    url = f"/api/projects/{project.pk}/policy-versions/"
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    parent = tiny_policy
    for n in range(5):
        parent = PolicyVersion.objects.create(project=project, name=f"v{n}", kind="external", parent=parent)
    with django_assert_max_num_queries(len(queries)):
        assert len(client.get(url).json()["results"]) == 6
