"""The researcher's training page: who may use it, snapshots, the launch form of every run kind (generated from
its config, errors beside the inputs, recipes and a run-time estimate) and the policy versions' figures. The runs
table, re-run and the run page are test_training_runs.py."""

from __future__ import annotations

import dataclasses
from html import unescape
from pathlib import Path

import pytest

from feedback_app.launch_forms.forms import LAUNCH_KINDS, run_form
from feedback_app.models import (
    DatasetSnapshot,
    Evaluation,
    PolicyVersion,
    RunStatus,
    TrainingRun,
)
from tests.feedback_app.training_pages import HTMX, field_html, url
from training.policy_runs import MANAGED_SETTINGS, TRAINERS

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]


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


def test_the_forms_cover_every_run_kind_tandem_trains():
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


def launch_sft(client, researcher, project, policy, snapshot, fields):
    """The researcher's SFT launch from the training page's form: `policy` on `snapshot`, with `fields` (the form's
    config.* and review.* inputs)."""
    client.force_login(researcher)
    return client.post(
        url(project, "training-launch"), {"kind": "sft", "base_policy": policy.pk, "snapshot": snapshot.pk, **fields}
    )


def test_a_policy_run_is_launched_from_the_form_keeping_only_changed_settings(
    client, project, researcher, tiny_policy, sft_snapshot
):
    fields = {
        "config.max_steps": "5",
        "config.learning_rate": "0.0001",  # SFT's default: left out of the config
        "config.use_lora": ["false"],
        "config.sources": "intervention, demonstration",
        "config.name": "tiny-sft",
        "review.enabled": ["false", "true"],  # the hidden input, then the ticked box
        "review.num_tasks": "4",
    }
    response = launch_sft(client, researcher, project, tiny_policy, sft_snapshot, fields)
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
    fields = {
        "config.max_steps": "many",  # does not parse
        "config.learning_rate": "7",  # the trainer's own checks, one after another in __post_init__
        "config.batch_size": "0",
        "config.eval_tasks": "-1",
        "config.precision": "fp64",
        "review.num_tasks": "0",
    }
    response = launch_sft(client, researcher, project, tiny_policy, sft_snapshot, fields)
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
