"""The researcher's training page and run page: who may use them, snapshots, the launch form of every run kind
(generated from its config, errors beside the inputs), re-run, the polled runs table with ETA and cancel, and the
run page's progress, metric curves, config and log tail."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from html import unescape
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from feedback_app.launch_forms.forms import LAUNCH_KINDS, run_form
from feedback_app.models import (
    DatasetSnapshot,
    Evaluation,
    PolicyVersion,
    RegisteredModel,
    RunStatus,
    TrainingRun,
)
from training.policy_runs import MANAGED_SETTINGS, TRAINERS

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


def url(project, name="training", *args):
    return reverse(name, args=[project.pk, *args])


def field_html(body: str, name: str) -> str:
    """The markup of the launch form's input `name` with its help and error (one `launch-field` block)."""
    blocks = [block for block in body.split('<div class="launch-field') if f'name="{name}"' in block]
    assert blocks, f"no input named {name}"
    return blocks[0].split("</div>")[0]


@pytest.fixture
def sft_snapshot(client, project, researcher, demonstrations):
    client.force_login(researcher)
    client.post(url(project, "training-snapshot"), {"export_kind": "sft", "name": "demos"})
    return DatasetSnapshot.objects.get(name="demos")


@pytest.fixture
def reward_model(project, tiny_policy):
    run = TrainingRun.objects.create(project=project, kind="reward_model", status=RunStatus.SUCCEEDED)
    return RegisteredModel.objects.create(
        project=project, name="rm-1", kind="reward_model", path=str(tiny_policy.weights_path), run=run, base_model="/b"
    )


# --- who may -------------------------------------------------------------------------------------------------------


def test_only_researchers_and_admins_may_open_launch_or_rerun(client, project, annotator, outsider, researcher):
    run = TrainingRun.objects.create(project=project, kind="sft", status=RunStatus.FAILED)
    pages = [url(project), url(project) + "?kind=ppo", url(project, "training-run", run.pk)]
    posts = [url(project, "training-launch"), url(project, "training-rerun", run.pk)]
    client.force_login(outsider)
    assert [client.get(page, **HTMX).status_code for page in pages] == [404, 404, 404]
    assert [client.post(post, {"kind": "sft"}).status_code for post in posts] == [404, 404]
    client.force_login(annotator)
    assert [client.get(page).status_code for page in pages] == [403, 403, 403]
    assert [client.post(post, {"kind": "sft"}).status_code for post in posts] == [403, 403]
    assert TrainingRun.objects.count() == 1
    client.force_login(researcher)
    response = client.get(url(project))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Freeze labels" in body and "Launch a run" in body and 'id="launch-form"' in body


# --- the launch form of every kind ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", LAUNCH_KINDS)
def test_each_kind_has_a_launch_form_with_its_config_defaults(client, project, researcher, kind):
    form = run_form(kind)
    client.force_login(researcher)
    response = client.get(url(project) + f"?kind={kind}", **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and "<h1>" not in body  # the kind selector swaps the form alone
    assert f'name="kind" value="{kind}"' in body
    on_form = {setting.name for setting in form.settings}
    for setting in form.settings:
        html = field_html(body, f"config.{setting.name}")
        assert f'value="{setting.shown(setting.default)}"' in html or setting.input in ("checkbox", "json")
        if setting.input == "checkbox" and setting.default:
            assert "checked" in html
        assert setting.help[:30] in unescape(html)
    # What Tandem fills in itself is not on the form.
    for managed in ("output_dir", "data_path", "policy_path", "base_model", "snapshot_hash", "environment"):
        assert f'name="config.{managed}"' not in body and managed not in on_form
    for choice in form.judges:
        assert f'name="judges.{choice.setting}"' in body
    assert ('name="snapshot"' in body) == bool(form.export_kinds)


def test_the_forms_cover_every_run_kind_of_the_issue():
    wanted = {"reward_model", "prm", "value_critic", "generative_critic", "dpo", "kto", "sft", "ppo", "nash_md"}
    assert wanted | {"spo", "grpo", "rollout"} <= set(LAUNCH_KINDS)
    ppo = {setting.name: setting for setting in run_form("ppo").settings}
    assert ppo["kl_beta"].default == 0.02 and not ppo["kl_beta"].shared and ppo["learning_rate"].shared
    assert "reward_model_path" not in ppo  # a judge picker, not a text box
    assert [choice.setting for choice in run_form("grpo").judges if choice.required] == ["reward_model_path"]
    # Every setting of the trainer's dataclass is on the form, or filled in by Tandem.
    sft = {setting.name for setting in run_form("sft").settings}
    config_class = TRAINERS["sft"].config_class
    assert sft == {f.name for f in dataclasses.fields(config_class)} - {*MANAGED_SETTINGS}


def test_a_policy_run_is_launched_from_the_form_keeping_only_changed_settings(
    client, project, researcher, tiny_policy, sft_snapshot
):
    client.force_login(researcher)
    response = client.post(
        url(project, "training-launch"),
        {
            "kind": "sft",
            "base_policy": tiny_policy.pk,
            "snapshot": sft_snapshot.pk,
            "config.max_steps": "5",
            "config.learning_rate": "0.0001",  # SFT's default: left out of the config
            "config.use_lora": ["false"],
            "config.sources": "intervention, demonstration",
            "config.name": "tiny-sft",
            "review.enabled": ["false", "true"],  # the hidden input, then the ticked box
            "review.num_tasks": "4",
        },
    )
    run = TrainingRun.objects.get(kind="sft")
    assert response.status_code == 303 and response["Location"] == url(project, "training-run", run.pk)
    assert (run.base_policy, run.snapshot, run.status, run.created_by) == (
        tiny_policy,
        sft_snapshot,
        RunStatus.QUEUED,
        researcher,
    )
    assert run.config == {"max_steps": 5, "sources": ["intervention", "demonstration"], "name": "tiny-sft"}
    assert run.inputs["review"] == {"enabled": True, "num_tasks": 4, "samples_per_task": 1, "priority": 10}
    assert f'id="run-{run.pk}"' in client.get(url(project)).content.decode()


def test_a_judge_run_and_online_policy_runs_take_their_judges_from_the_pickers(
    client, project, researcher, tiny_policy, reward_model
):
    client.force_login(researcher)
    launch = {"base_policy": tiny_policy.pk, "config.max_steps": "3"}
    response = client.post(
        url(project, "training-launch"), {"kind": "grpo", "judges.reward_model_path": reward_model.pk, **launch}
    )
    assert response.status_code == 303, response.content.decode()
    grpo = TrainingRun.objects.get(kind="grpo")
    assert grpo.inputs["judges"] == {"reward_model_path": reward_model.pk} and grpo.snapshot is None
    response = client.post(
        url(project, "training-launch"), {"kind": "ppo", "config.reward_source": "oracle", **launch}
    )
    assert response.status_code == 303, response.content.decode()
    assert TrainingRun.objects.get(kind="ppo").config == {"reward_source": "oracle", "max_steps": 3}
    response = client.post(
        url(project, "training-launch"),
        {
            "kind": "rollout",
            "base_policy": tiny_policy.pk,
            "config.num_tasks": "2",
            "config.greedy": ["false", "true"],
        },
    )
    assert response.status_code == 303, response.content.decode()
    rollout = TrainingRun.objects.get(kind="rollout")
    assert rollout.base_policy == tiny_policy and rollout.config["num_tasks"] == 2 and rollout.config["greedy"] is True


def test_a_judge_run_is_launched_on_a_snapshot_made_from_filters_in_the_same_form(
    client, project, researcher, tiny_policy, demonstrations
):
    client.force_login(researcher)
    response = client.post(
        url(project, "training-launch"),
        {
            "kind": "value_critic",
            "snapshot": "new",
            "new_snapshot.export_kind": "returns",
            "new_snapshot.name": "returns-now",
            "new_snapshot.since": "2020-01-01",
            "config.gamma": "0.9",
            "base_policy": tiny_policy.pk,
            "confirm_data": "true",  # six rows, under one batch of eight: launched anyway
        },
    )
    assert response.status_code == 303, response.content.decode()
    snapshot = DatasetSnapshot.objects.get(name="returns-now")
    run = TrainingRun.objects.get(kind="value_critic")
    assert run.snapshot == snapshot and snapshot.row_count == 6 and snapshot.filters["since"].startswith("2020-01-01")
    assert run.base_policy == tiny_policy and run.config == {"gamma": 0.9}


def test_a_failed_launch_keeps_no_snapshot_it_made(client, project, researcher, tiny_policy, demonstrations, settings):
    client.force_login(researcher)
    response = client.post(
        url(project, "training-launch"),
        {"kind": "sft", "snapshot": "new", "new_snapshot.name": "demos-now", "config.learning_rate": "7"},
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "must be between 0 and 1" in field_html(body, "config.learning_rate")
    assert not DatasetSnapshot.objects.exists() and not TrainingRun.objects.exists()
    assert not list(Path(settings.ARTIFACT_ROOT).rglob("*.jsonl"))
    # The form comes back as posted: a new snapshot, its name, the bad value.
    assert 'value="7"' in field_html(body, "config.learning_rate")
    assert 'value="demos-now"' in field_html(body, "new_snapshot.name")


def test_bad_input_is_shown_beside_its_field_and_nothing_is_stored(
    client, project, researcher, tiny_policy, sft_snapshot
):
    client.force_login(researcher)
    response = client.post(
        url(project, "training-launch"),
        {"kind": "sft", "snapshot": sft_snapshot.pk, "config.max_steps": "many", "config.num_epochs": "0.5.1"},
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "must be a whole number, not &#x27;many&#x27;" in field_html(body, "config.max_steps")
    assert "must be a number" in field_html(body, "config.num_epochs")
    assert 'aria-invalid="true"' in field_html(body, "config.max_steps")

    response = client.post(url(project, "training-launch"), {"kind": "grpo", "base_policy": tiny_policy.pk})
    html = field_html(response.content.decode(), "judges.reward_model_path")
    assert response.status_code == 400 and "a grpo run needs a registered reward_model" in html

    response = client.post(url(project, "training-launch"), {"kind": "sft", "snapshot": "999"})
    assert "no such choice in this project" in field_html(response.content.decode(), "snapshot")
    response = client.post(url(project, "training-launch"), {"kind": "rollout", "config.temperature": "0"})
    assert "must be positive" in field_html(response.content.decode(), "config.temperature")
    response = client.post(url(project, "training-launch"), {"kind": "everything"})
    assert response.status_code == 400 and "kind: not a kind the dashboard launches" in response.content.decode()
    assert not TrainingRun.objects.exists()


def test_every_bad_input_is_shown_at_once_each_beside_its_field(
    client, project, researcher, tiny_policy, sft_snapshot
):
    client.force_login(researcher)
    response = client.post(
        url(project, "training-launch"),
        {
            "kind": "sft",
            "base_policy": tiny_policy.pk,
            "snapshot": sft_snapshot.pk,
            "config.max_steps": "many",  # does not parse
            "config.learning_rate": "7",  # the trainer's own checks, one after another in __post_init__
            "config.batch_size": "0",
            "config.eval_tasks": "-1",
            "config.precision": "fp64",
            "review.num_tasks": "0",
        },
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "whole number" in field_html(body, "config.max_steps")
    assert "must be between 0 and 1" in field_html(body, "config.learning_rate")
    assert "must be positive" in field_html(body, "config.batch_size")
    assert "must be 0 (skip) or positive" in field_html(body, "config.eval_tasks")
    assert "must be one of auto, fp32, bf16, fp16" in field_html(body, "config.precision")
    assert "from 1 to 1000" in field_html(body, "review.num_tasks")
    assert body.count('class="field-error" id="launch-') == 6
    assert not TrainingRun.objects.exists()


def test_the_form_names_no_base_policy_or_snapshot_for_the_researcher(
    client, project, researcher, tiny_policy, sft_snapshot, django_user_model
):
    newer = PolicyVersion.objects.create(project=project, name="someone-elses", weights_path=tiny_policy.weights_path)
    client.force_login(researcher)
    body = client.get(url(project), {"kind": "sft"}).content.decode()
    assert '<option value="" selected>— choose —</option>' in field_html(body, "base_policy")
    assert f'<option value="{newer.pk}">someone-elses' in field_html(body, "base_policy")
    snapshot = field_html(body, "snapshot")
    assert '<option value="" selected>— choose a snapshot —</option>' in snapshot
    assert "demos (sft, 6 rows, by researcher," in snapshot
    response = client.post(url(project, "training-launch"), {"kind": "sft"})
    body = response.content.decode()
    assert response.status_code == 400 and not TrainingRun.objects.exists()
    assert "choose the policy version this run starts from" in field_html(body, "base_policy")
    assert "choose the snapshot to train on" in field_html(body, "snapshot")


def test_the_run_page_names_its_base_policy_and_snapshot(client, project, researcher, tiny_policy, sft_snapshot):
    run = TrainingRun.objects.create(
        project=project, kind="sft", base_policy=tiny_policy, snapshot=sft_snapshot, created_by=researcher
    )
    client.force_login(researcher)
    body = client.get(url(project, "training-run", run.pk)).content.decode()
    facts = body.split('<dl class="run-facts">')[1].split("</dl>")[0]
    assert f'<dt>Base policy</dt><dd>tiny <span class="muted">(version {tiny_policy.pk}' in facts
    assert "<dt>Snapshot</dt><dd>demos" in facts and "by researcher" in facts


def test_the_form_offers_the_tiny_model_recipe_and_estimates_the_run_time(client, project, researcher, tiny_policy):
    client.force_login(researcher)
    body = client.get(url(project), {"kind": "reward_model"}).content.decode()
    assert "?kind=reward_model&amp;recipe=tiny" in body
    body = client.get(url(project), {"kind": "reward_model", "recipe": "tiny"}, **HTMX).content.decode()
    assert 'value="0.001"' in field_html(body, "config.learning_rate")
    assert '<option value="moves" selected>' in field_html(body, "config.layout")
    assert "recipe=tiny" not in client.get(url(project), {"kind": "dpo"}).content.decode()

    # DPO's defaults evaluate the base and the trained policy on 200 tasks, a greedy and a sampled episode each:
    # most of a CPU run.
    body = client.get(url(project), {"kind": "dpo"}).content.decode()
    estimate = body.split('id="launch-estimate"')[1].split("</p>")[0]
    assert "evaluating the base and the trained policy on 800 held-out episodes: 2 min 56 s" in estimate
    response = client.get(
        url(project, "training-estimate"), {"kind": "dpo", "config.eval_tasks": "10", "config.eval_base": "false"}
    )
    assert "evaluating the trained policy on 20 held-out episodes: 4 s" in response.content.decode()


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
    run = TrainingRun.objects.create(
        project=project,
        kind="sft",
        base_policy=tiny_policy,
        status=RunStatus.RUNNING,
        started_at=timezone.now() - timedelta(seconds=100),
        progress_current=25,
        progress_total=100,
    )
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
    run = TrainingRun.objects.create(
        project=project,
        kind="generative_critic",
        status=RunStatus.RUNNING,
        started_at=timezone.now() - timedelta(seconds=60),
        progress_current=2,
        progress_total=8,
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
    run = TrainingRun.objects.create(
        project=project,
        kind="dpo",
        status=RunStatus.RUNNING,
        started_at=timezone.now() - timedelta(seconds=120),
        phase_started_at=timezone.now() - timedelta(seconds=37),
        progress_phase="evaluating the base policy: greedy",
        progress_current=37,
        progress_total=200,
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


def test_policy_versions_show_held_out_success_and_the_human_win_rate(client, project, researcher, tiny_policy):
    child = PolicyVersion.objects.create(
        project=project, name="tiny+ppo", kind="local", weights_path="/w", parent=tiny_policy
    )
    for decoding, value, stderr in (("greedy", 0.625, 0.03), ("sampled", 0.7, 0.032)):
        Evaluation.objects.create(
            project=project,
            policy_version=child,
            name="heldout_success",
            decoding=decoding,
            value=value,
            stderr=stderr,
            n=200,
        )
    client.force_login(researcher)
    body = client.get(url(project)).content.decode()
    row = body[body.index(f'id="policy-{child.pk}"') :].split("</tr>")[0]
    assert "0.625 ± 0.030 / 0.700 ± 0.032" in row and "(200 tasks)" in row
    assert "awaiting labels" in row  # no comparison against the parent yet


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
