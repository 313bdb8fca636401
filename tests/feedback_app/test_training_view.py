"""The researcher's training page: who may use it, snapshots, launching judge and policy runs (with errors named
beside the form), the polled runs table and cancel."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback_app.models import DatasetSnapshot, Evaluation, PolicyVersion, RunStatus, TrainingRun

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


def url(project, name="training", *args):
    return reverse(name, args=[project.pk, *args])


def test_only_researchers_and_admins_may_open_it(client, project, annotator, outsider, researcher):
    client.force_login(outsider)
    assert client.get(url(project)).status_code == 404
    client.force_login(annotator)
    assert client.get(url(project)).status_code == 403
    assert client.post(url(project, "training-policy"), {"kind": "sft"}).status_code == 403
    client.force_login(researcher)
    response = client.get(url(project))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Freeze labels" in body and "Train a judge model" in body and "Fine-tune the policy" in body


def test_a_snapshot_is_made_from_the_page_and_listed(client, project, researcher, demonstrations):
    client.force_login(researcher)
    response = client.post(url(project, "training-snapshot"), {"export_kind": "sft", "name": "demos"})
    assert response.status_code == 303
    snapshot = DatasetSnapshot.objects.get(project=project, name="demos")
    assert (snapshot.export_kind, snapshot.row_count) == ("sft", 6)
    assert "demos" in client.get(url(project)).content.decode()


def test_a_bad_snapshot_request_names_the_field(client, project, researcher):
    client.force_login(researcher)
    response = client.post(url(project, "training-snapshot"), {"export_kind": "everything", "name": "x"})
    assert response.status_code == 400 and "export_kind: not an export kind" in response.content.decode()
    response = client.post(url(project, "training-snapshot"), {"export_kind": "sft", "name": " "})
    assert response.status_code == 400 and "name: A snapshot needs a name." in response.content.decode()
    assert not DatasetSnapshot.objects.exists()


def test_a_policy_run_is_launched_from_the_form_with_its_settings(
    client, project, researcher, tiny_policy, demonstrations
):
    client.force_login(researcher)
    client.post(url(project, "training-snapshot"), {"export_kind": "sft", "name": "demos"})
    snapshot = DatasetSnapshot.objects.get(name="demos")
    response = client.post(
        url(project, "training-policy"),
        {
            "kind": "sft",
            "base_policy": tiny_policy.pk,
            "snapshot": snapshot.pk,
            "settings": '{"max_steps": 5}',
            "name": "tiny-sft",
            "review_tasks": "4",
        },
    )
    assert response.status_code == 303, response.content.decode()
    run = TrainingRun.objects.get(kind="sft")
    assert (run.base_policy, run.snapshot, run.status) == (tiny_policy, snapshot, RunStatus.QUEUED)
    assert run.config == {"max_steps": 5, "name": "tiny-sft"}
    assert run.inputs["review"] == {"enabled": False, "num_tasks": 4, "samples_per_task": 1, "priority": 10}
    assert f'id="run-{run.pk}"' in client.get(url(project)).content.decode()


def test_a_bad_launch_comes_back_with_each_reason_and_stores_nothing(client, project, researcher, tiny_policy):
    client.force_login(researcher)
    response = client.post(url(project, "training-policy"), {"kind": "sft", "settings": "{max_steps: 5}"})
    assert response.status_code == 400
    assert "settings: not JSON" in response.content.decode()
    response = client.post(url(project, "training-policy"), {"kind": "sft", "settings": '{"learning_rate": 7}'})
    body = response.content.decode()
    assert response.status_code == 400 and "snapshot: a sft run learns from a sft snapshot" in body
    response = client.post(url(project, "training-judge"), {"kind": "reward_model", "snapshot": "999"})
    assert response.status_code == 400 and "snapshot: no such choice in this project" in response.content.decode()
    assert not TrainingRun.objects.exists()


def test_the_runs_table_polls_while_a_run_is_active_and_cancel_stops_it(client, project, researcher, tiny_policy):
    run = TrainingRun.objects.create(project=project, kind="sft", base_policy=tiny_policy)
    client.force_login(researcher)
    fragment = client.get(url(project, "training-runs"), **HTMX).content.decode()
    assert 'hx-trigger="every 3s"' in fragment and f'id="run-{run.pk}"' in fragment and "<h1>" not in fragment

    fragment = client.post(url(project, "training-cancel", run.pk), **HTMX).content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert 'hx-trigger="every 3s"' not in fragment  # nothing left to watch


def test_policy_versions_show_held_out_success_and_the_human_win_rate(client, project, researcher, tiny_policy):
    child = PolicyVersion.objects.create(
        project=project, name="tiny+ppo", kind="local", weights_path="/w", parent=tiny_policy
    )
    Evaluation.objects.create(
        project=project,
        policy_version=child,
        name="heldout_success",
        decoding="greedy",
        value=0.625,
        stderr=0.03,
        n=200,
    )
    Evaluation.objects.create(
        project=project,
        policy_version=child,
        name="heldout_success",
        decoding="sampled",
        value=0.7,
        stderr=0.032,
        n=200,
    )
    client.force_login(researcher)
    body = client.get(url(project)).content.decode()
    row = body[body.index(f'id="policy-{child.pk}"') :].split("</tr>")[0]
    assert "0.625 ± 0.030 / 0.700 ± 0.032" in row and "(200 tasks)" in row
    assert "awaiting labels" in row  # no comparison against the parent yet


def test_a_run_page_shows_progress_metrics_figures_samples_and_the_log(client, project, researcher, annotator):
    run = TrainingRun.objects.create(
        project=project,
        kind="generative_critic",
        status=RunStatus.SUCCEEDED,
        progress_current=8,
        progress_total=8,
        metrics=[{"step": 4, "loss": 2.5}, {"step": 8, "loss": 1.25, "learning_rate": 0.0001}],
        summary={
            "metrics": {"eval_loss": 1.5, "base_eval_loss": 3.0},
            "samples": [{"prompt": "User: . A | G .", "generated": "the agent walks away", "reference": "wrong way"}],
        },
        log="12:00:00 trained 8 steps\n",
    )
    client.force_login(annotator)
    assert client.get(url(project, "training-run", run.pk)).status_code == 403
    client.force_login(researcher)
    body = client.get(url(project, "training-run", run.pk)).content.decode()
    assert "8/8" in body and "1.2500" in body and "0.0001" in body  # the series, with gaps shown as —
    assert "eval_loss" in body and "1.5000" in body
    assert "the agent walks away" in body and "wrong way" in body
    assert "trained 8 steps" in body
    assert 'hx-trigger="every 3s"' not in body  # finished: nothing to poll
