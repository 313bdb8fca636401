"""A launch checks the snapshot against its trainer before any worker sees it: rows the trainer would refuse are a
400 that names them and why, the snapshot filters can leave them out, and a snapshot that gives a run less than a
batch of data needs a confirmation. A run that fails anyway shows its reason first and its traceback folded."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback_app.exports.filters import ExportFilters
from feedback_app.exports.snapshots import create_snapshot
from feedback_app.models import Comparison, RunStatus, TrainingRun
from reward_models.common.config import ConfigError
from reward_models.envs.gridworld import GridWorld
from tests.feedback_app.labels import stored_intervention
from tests.feedback_app.views.test_training import field_html
from training.runs import execute_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]


def launch_url(project) -> str:
    return reverse("training-launch", args=[project.pk])


@pytest.fixture
def mixed_comparisons(project, annotator, make_trajectory):
    """A comparison of two rollouts of one task, and one of two imported trajectories of the same task that start
    from different observations: a whole-trajectory pair trains on the first, not on the second."""
    rollouts = [make_trajectory(source="policy") for _ in range(2)]
    imported = [make_trajectory(source="import") for _ in range(2)]
    other = imported[1]
    other.prompt = [*other.prompt[:-1], {"role": "user", "content": "a map drawn another way"}]
    other.save(update_fields=["prompt"])
    for a, b in (rollouts, imported):
        Comparison.objects.create(project=project, annotator=annotator, trajectory_a=a, trajectory_b=b, choice="a")


def test_a_snapshot_the_trainer_would_refuse_is_refused_at_launch_naming_its_rows(
    client, project, researcher, tiny_policy, mixed_comparisons
):
    snapshot = create_snapshot(project, "preference", ExportFilters(), user=researcher, name="everything")
    client.force_login(researcher)
    response = client.post(
        launch_url(project), {"kind": "dpo", "base_policy": tiny_policy.pk, "snapshot": snapshot.pk}
    )
    assert response.status_code == 400 and not TrainingRun.objects.exists()
    html = field_html(response.content.decode(), "snapshot")
    assert (
        "1 of 2 rows cannot be used: row 2: the prompt must end with an observation (a user or tool message)" in html
    )
    assert "trajectory sources (policy, human, import)" in html


def test_the_snapshot_filters_leave_such_rows_out_by_trajectory_source(
    client, project, researcher, tiny_policy, mixed_comparisons
):
    client.force_login(researcher)
    form = {
        "kind": "dpo",
        "base_policy": tiny_policy.pk,
        "snapshot": "new",
        "new_snapshot.export_kind": "preference",
        "new_snapshot.name": "rollouts-only",
        "new_snapshot.sources": ["policy", "human"],
        "confirm_data": "true",
    }
    response = client.post(launch_url(project), form)
    assert response.status_code == 303, response.content.decode()
    run = TrainingRun.objects.get()
    assert run.snapshot.row_count == 1 and run.snapshot.filters == {"sources": ["human", "policy"]}
    assert run.inputs["data"]["rows"] == 1 and run.inputs["data"]["used"] == 1


def test_a_snapshot_too_small_for_the_settings_is_launched_only_when_confirmed(
    client, project, researcher, annotator, tiny_policy, make_trajectory
):
    # Seven interventions, lopsided as on a policy that over-uses "down": balance=action keeps two of them.
    for corrected, original in [("up", "down")] * 4 + [("left", "down")] * 2 + [("down", "up")]:
        trajectory = make_trajectory(n_steps=2)
        step = trajectory.steps.get(index=0)
        step.action, step.message = original, GridWorld().message_for_action(original, "")
        step.save()
        stored_intervention(annotator, step, corrected)
    snapshot = create_snapshot(project, "step_preference", ExportFilters(), user=researcher, name="corrections")
    client.force_login(researcher)
    form = {"kind": "dpo", "base_policy": tiny_policy.pk, "snapshot": snapshot.pk}
    response = client.post(launch_url(project), form)
    assert response.status_code == 400 and not TrainingRun.objects.exists()
    warning = field_html(response.content.decode(), "confirm_data")
    assert "Only 2 pairs for a batch of 16" in warning
    assert "5 are left out by balance=action (every action must be chosen as often as it is rejected)" in warning
    assert "1 optimiser step of 16 pairs" in warning

    response = client.post(launch_url(project), {**form, "confirm_data": "true"})
    assert response.status_code == 303
    run = TrainingRun.objects.get()
    assert run.inputs["data"] | {"warning": ""} == {
        "rows": 7, "ties": 0, "pairs": 7, "unbalanced": 5, "used": 2, "steps": 1, "warning": "",
        "summary": "2 of 7 rows train as pairs; 5 are left out by balance=action (every action must be chosen as "
        "often as it is rejected): 1 optimiser step of 16 pairs",
    }  # fmt: skip
    page = client.get(reverse("training-run", args=[project.pk, run.pk])).content.decode()
    data = page.split('<dd class="run-data">')[1].split("</dd>")[0]
    assert data.startswith("2 of 7 rows train as pairs; 5 are left out by balance=action")
    assert "Launched anyway over the warning" in data


def test_a_failed_run_shows_its_reason_first_and_its_traceback_folded(client, project, researcher, tiny_policy):
    run = TrainingRun.objects.create(project=project, kind="dpo", base_policy=tiny_policy)

    def body(run, recorder):
        raise ConfigError("data_path", "1 of 40 rows cannot be used: row 13: the prompt must end with an observation")

    assert execute_run(run.pk, body) == RunStatus.FAILED
    run.refresh_from_db()
    reason = "data_path: 1 of 40 rows cannot be used: row 13: the prompt must end with an observation"
    assert run.error_reason == reason
    assert run.error_traceback.startswith("Traceback (most recent call last):")
    client.force_login(researcher)
    page = client.get(reverse("training-run", args=[project.pk, run.pk])).content.decode()
    failure = page.split('<section class="run-error">')[1].split("</section>")[0]
    assert failure.index("row 13: the prompt must end") < failure.index("<details><summary>Traceback</summary>")
    table = client.get(reverse("training", args=[project.pk])).content.decode()
    row = table.split(f'id="run-{run.pk}"')[1].split("</tr>")[0]
    assert "row 13: the prompt must end" in row and "Traceback" not in row


def test_a_run_that_failed_before_reasons_were_kept_shows_its_tracebacks_last_line(project):
    run = TrainingRun(project=project, kind="dpo", error="Traceback (most recent call last):\n  ...\nValueError: bad")
    assert run.error_reason == "ValueError: bad" and run.error_traceback == run.error
