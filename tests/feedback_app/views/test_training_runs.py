"""The runs on the training page and a run's own page: re-run, the polled runs table with ETA and cancel, and the
run page's progress, phase, metric curves, config and log tail."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from feedback_app.models import (
    RunStatus,
    TrainingRun,
)
from tests.feedback_app.training_pages import HTMX, field_html, url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]


def running_run(project, kind, *, elapsed, progress, **fields):
    """A run of `kind` that started `elapsed` seconds ago and has done `progress` = (current, total) of its work."""
    return TrainingRun.objects.create(
        project=project,
        kind=kind,
        status=RunStatus.RUNNING,
        started_at=timezone.now() - timedelta(seconds=elapsed),
        progress_current=progress[0],
        progress_total=progress[1],
        **fields,
    )


def test_the_run_page_names_its_base_policy_and_snapshot(client, project, researcher, tiny_policy, sft_snapshot):
    run = TrainingRun.objects.create(
        project=project, kind="sft", base_policy=tiny_policy, snapshot=sft_snapshot, created_by=researcher
    )
    client.force_login(researcher)
    body = client.get(url(project, "training-run", run.pk)).content.decode()
    facts = body.split('<dl class="run-facts">')[1].split("</dl>")[0]
    assert f'<dt>Base policy</dt><dd>tiny <span class="muted">(version {tiny_policy.pk}' in facts
    assert "<dt>Snapshot</dt><dd>demos" in facts and "by researcher" in facts


# --- re-run --------------------------------------------------------------------------------------------------------


def test_rerun_launches_the_same_kind_snapshot_base_judges_and_settings(
    client, project, researcher, tiny_policy, reward_model
):
    old = TrainingRun.objects.create(
        project=project,
        kind="grpo",
        status=RunStatus.SUCCEEDED,
        base_policy=tiny_policy,
        config={"max_steps": 3, "kl_beta": 0.1, "name": "tiny-grpo"},
        inputs={"judges": {"reward_model_path": reward_model.pk}, "review": {"enabled": False, "num_tasks": 4}},
    )
    client.force_login(researcher)
    body = client.get(url(project, "training-run", old.pk)).content.decode()
    assert url(project, "training-rerun", old.pk) in body
    response = client.post(url(project, "training-rerun", old.pk))
    new = TrainingRun.objects.filter(kind="grpo").exclude(pk=old.pk).get()
    assert response.status_code == 303 and response["Location"] == url(project, "training-run", new.pk)
    assert (new.kind, new.base_policy, new.status, new.created_by) == (
        "grpo",
        tiny_policy,
        RunStatus.QUEUED,
        researcher,
    )
    assert new.config == {"max_steps": 3, "kl_beta": 0.1}  # the name belongs to the old run's version
    assert new.inputs["judges"] == old.inputs["judges"] and new.inputs["review"]["num_tasks"] == 4


def test_rerun_of_a_snapshot_run_and_of_a_rollout(client, project, researcher, tiny_policy, sft_snapshot):
    client.force_login(researcher)
    client.post(url(project, "training-launch"), {"kind": "sft", "snapshot": sft_snapshot.pk, "config.max_steps": "4"})
    client.post(url(project, "training-launch"), {"kind": "rollout", "config.num_tasks": "3"})
    for old in list(TrainingRun.objects.all()):
        assert client.post(url(project, "training-rerun", old.pk)).status_code == 303
        new = TrainingRun.objects.filter(kind=old.kind).exclude(pk=old.pk).get()
        assert (new.snapshot, new.base_policy, new.config) == (old.snapshot, old.base_policy, old.config)


def test_a_rerun_that_no_longer_passes_comes_back_as_the_filled_form_with_the_reason(
    client, project, researcher, tiny_policy
):
    old = TrainingRun.objects.create(
        project=project,
        kind="grpo",
        status=RunStatus.FAILED,
        base_policy=tiny_policy,
        config={"max_steps": 7},
        inputs={"judges": {"reward_model_path": 12345}},
    )
    client.force_login(researcher)
    response = client.post(url(project, "training-rerun", old.pk))
    body = response.content.decode()
    assert response.status_code == 400 and TrainingRun.objects.count() == 1
    assert "no longer registered" in field_html(body, "judges.reward_model_path")
    assert 'value="7"' in field_html(body, "config.max_steps")
    assert 'name="kind" value="grpo"' in body


# --- runs table and run page ---------------------------------------------------------------------------------------


def test_the_runs_table_polls_with_an_eta_and_cancel_stops_a_run(client, project, researcher, tiny_policy):
    run = running_run(project, "sft", elapsed=100, progress=(25, 100), base_policy=tiny_policy)
    client.force_login(researcher)
    fragment = client.get(url(project, "training-runs"), **HTMX).content.decode()
    assert 'hx-trigger="every 3s"' in fragment and f'id="run-{run.pk}"' in fragment and "<h1>" not in fragment
    assert re.search(r"ETA 5 min 0\d s", fragment)  # 100 s for a quarter: 300 s to go

    fragment = client.post(url(project, "training-cancel", run.pk), **HTMX).content.decode()
    run.refresh_from_db()
    assert run.cancel_requested and 'id="runs"' in fragment
    queued = TrainingRun.objects.create(project=project, kind="sft", base_policy=tiny_policy)
    fragment = client.post(url(project, "training-cancel", queued.pk), **HTMX, HTTP_HX_TARGET="run").content.decode()
    queued.refresh_from_db()
    assert queued.status == RunStatus.CANCELLED
    assert fragment.startswith('\n<div id="run"') or '<div id="run"' in fragment[:200]
    assert "every 3s" not in fragment and "Re-run" in fragment  # finished: nothing to poll, re-run offered


def test_a_run_page_shows_progress_eta_curves_config_figures_samples_and_the_log_tail(client, project, researcher):
    run = running_run(
        project,
        "generative_critic",
        elapsed=60,
        progress=(2, 8),
        config={"max_steps": 8},
        inputs={"judges": {}},
        metrics=[
            {"step": 2, "loss": 2.5, "kl": 0.1},
            {"step": 4, "loss": 1.25, "kl": 0.2, "learning_rate": 0.0001},
            {"step": 4, "total_flos": 1.2e10},
        ],
        summary={
            "metrics": {"eval_loss": 1.5, "base_eval_loss": 3.0},
            "samples": [{"prompt": "User: . A | G .", "generated": "the agent walks away", "reference": "wrong way"}],
        },
        log="".join(f"line {i}\n" for i in range(200)),
    )
    client.force_login(researcher)
    body = client.get(url(project, "training-run", run.pk)).content.decode()
    assert "25 %" in body and "2/8" in body and "ETA 3 min 0" in body and "elapsed" in body
    charts = re.findall(r'<figure class="metric-chart" data-metric="([^"]+)"><svg', body)
    assert charts == ["loss", "kl"]  # one per metric, loss first
    # A metric reported once is no curve: it is in the table of last values.
    latest = body.split('class="grid-table latest-metrics"')[1].split("</table>")[0]
    assert "<td>learning_rate</td>" in latest and "<td>total_flos</td>" in latest
    loss_chart = body.split('data-metric="loss"')[1].split("</figure>")[0]
    assert loss_chart.count("<circle") == 2 and "<polyline" in loss_chart
    assert "eval_loss" in body and "1.5000" in body
    assert "the agent walks away" in body and "wrong way" in body
    assert "line 199" in body and "line 120" in body and "line 119\n" not in body and "last 80 of 200 lines" in body
    assert "&quot;max_steps&quot;: 8" in body
    assert 'hx-trigger="every 3s"' in body and "Cancel" in body

    fragment = client.get(url(project, "training-run", run.pk), **HTMX).content.decode()
    assert "<h1>" in fragment and "<html" not in fragment and "crumbs" not in fragment

    run.status, run.finished_at = RunStatus.SUCCEEDED, timezone.now()
    run.save()
    body = client.get(url(project, "training-run", run.pk)).content.decode()
    assert 'hx-trigger="every 3s"' not in body and "ETA" not in body and "Re-run" in body


def test_a_run_page_shows_the_phase_the_run_is_in_and_where_a_stopped_run_stopped(client, project, researcher):
    run = running_run(
        project,
        "dpo",
        elapsed=120,
        progress=(37, 200),
        phase_started_at=timezone.now() - timedelta(seconds=37),
        progress_phase="evaluating the base policy: greedy",
    )
    client.force_login(researcher)
    shown = client.get(url(project, "training-run", run.pk)).content.decode()
    progress = unescape(re.sub(r"<[^>]+>", "", shown.split('class="run-phase"')[1].split("</span>\n")[0]))
    # The ETA is the phase's own pace: 37 episodes in 37 s, 163 to go.
    assert "evaluating the base policy: greedy · 37/200 episodes (18 %) · ETA 2 min 43 s for this phase" in progress
    assert "2 min 00 s elapsed" in progress

    run.status, run.finished_at, run.cancel_requested = RunStatus.CANCELLED, timezone.now(), True
    run.progress_phase, run.progress_current, run.progress_total = "evaluating the trained policy: sampled", 12, 200
    run.save()
    shown = client.get(url(project, "training-run", run.pk)).content.decode()
    progress = re.sub(r"<[^>]+>", "", shown.split('class="run-phase"')[1].split("</span>\n")[0])
    assert "stopped while evaluating the trained policy: sampled, at 12/200 episodes" in progress
    assert "%" not in progress and "ETA" not in progress

    run.progress_phase, run.progress_current, run.progress_total = "", 5, 12
    run.save()
    table = client.get(url(project)).content.decode().split(f'id="run-{run.pk}"')[1].split("</tr>")[0]
    assert "training</span> 5/12" in table


def test_cancel_and_re_run_ask_for_a_confirmation_first(client, project, researcher, tiny_policy):
    queued = TrainingRun.objects.create(project=project, kind="dpo", base_policy=tiny_policy)
    done = TrainingRun.objects.create(project=project, kind="sft", base_policy=tiny_policy, status=RunStatus.SUCCEEDED)
    client.force_login(researcher)
    page = client.get(url(project)).content.decode()
    assert f'hx-confirm="Cancel run {queued.pk}?"' in page.split(f'id="run-{queued.pk}"')[1].split("</tr>")[0]
    assert 'data-confirm="Launch a new SFT run like run' in page.split(f'id="run-{done.pk}"')[1].split("</tr>")[0]
    assert 'hx-confirm="Cancel run' in client.get(url(project, "training-run", queued.pk)).content.decode()
    assert (
        'data-confirm="Launch a new SFT run with run'
        in client.get(url(project, "training-run", done.pk)).content.decode()
    )


def test_polling_a_run_costs_the_same_queries_however_long_its_series(
    client, project, researcher, django_assert_max_num_queries
):
    run = TrainingRun.objects.create(project=project, kind="ppo", status=RunStatus.RUNNING, progress_total=5000)
    client.force_login(researcher)
    client.get(url(project, "training-run", run.pk), **HTMX)  # session and user warm-up
    counts = []
    for points in (3, 3000):
        run.metrics = [{"step": i, "loss": 1 / (i + 1), "kl": i / 100, "reward": i % 7} for i in range(points)]
        run.progress_current = points
        run.save()
        with django_assert_max_num_queries(8) as captured:
            response = client.get(url(project, "training-run", run.pk), **HTMX)
        assert response.status_code == 200
        counts.append(len(captured))
    assert counts[0] == counts[1]
    # A long series is thinned for drawing, not dropped: the last point is still on the curve.
    assert response.content.decode().count("<polyline") == 3
