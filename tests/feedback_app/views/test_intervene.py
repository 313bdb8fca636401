"""The intervene page (correct a step, or take over for several steps, checked against the environment) and the
intervention status page that polls until the policy's continuation is done."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from feedback_app import labelling
from feedback_app.models import Intervention, Step, Trajectory
from tests.feedback_app.gridworld_play import FIRST_WRONG_INDEX, SEED_7_ACTIONS, play_gridworld
from tests.feedback_app.views.conftest import assert_refused

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def trajectory(task, external_policy):
    return play_gridworld(task, external_policy, SEED_7_ACTIONS)


def intervene_url(project, trajectory, index=FIRST_WRONG_INDEX):
    return reverse("intervene", args=[project.pk, trajectory.pk, index])


def status_url(project, intervention):
    return reverse("intervention-status", args=[project.pk, intervention.pk])


def submit(client, project, trajectory, index=FIRST_WRONG_INDEX, **data):
    data.setdefault("client_token", str(uuid.uuid4()))
    return client.post(intervene_url(project, trajectory, index), data, **HX)


def grid_rows(body: str) -> list[str]:
    """The rendered state of the play panel, one string per row (A the agent, G the goal, . for empty cells)."""
    figure = body[body.index('<figure class="play-state">') :]
    table = figure[: figure.index("</table>")]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        cells = re.findall(r'<td class="cell cell-(\w+)">(<span class="sr-only">wall</span>|[^<]*)</td>', row)
        # A wall is named for screen readers, nothing else is shown in it.
        assert all((kind == "wall") == ("sr-only" in text) for kind, text in cells)
        rows.append("".join({"wall": "#"}.get(kind) or text or "." for kind, text in cells))
    return rows


def store_intervention(user, trajectory, **fields):
    fields.setdefault("corrected_action", "up")
    with_commit = labelling.intervene(user, trajectory, step_index=FIRST_WRONG_INDEX, **fields)
    return with_commit.label


# The page ----------------------------------------------------------------------------------------------------------


def test_the_page_shows_the_state_the_original_action_and_the_legal_actions_with_keys(
    annotator_client, project, trajectory
):
    response = annotator_client.get(intervene_url(project, trajectory))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Intervene at step 3" in body
    assert 'data-span-field="action">down</code>' in body  # what the policy did
    for action, keys in [("up", "w ArrowUp"), ("down", "s ArrowDown"), ("left", "a ArrowLeft"), ("right", "d Arr")]:
        assert re.search(rf'name="pick" value="{action}" data-key="{keys}', body)
    assert grid_rows(body)[2].startswith("..A")  # before step 3 the agent is two cells right of its start
    assert 'name="csrfmiddlewaretoken"' in body and 'name="client_token"' in body


def test_an_annotator_sees_no_outcome_on_the_intervene_page(annotator_client, project, trajectory, external_policy):
    body = annotator_client.get(intervene_url(project, trajectory)).content.decode()
    assert "success" not in body and "reward" not in body and "oracle-secret" not in body
    assert external_policy.name not in body


def test_picking_an_action_fills_the_correction_and_shows_the_state_after_it(annotator_client, project, trajectory):
    response = annotator_client.get(intervene_url(project, trajectory), {"mode": "correct", "pick": "up"}, **HX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="intervene-play"')
    assert 'name="corrected_action" value="up"' in body
    rows = grid_rows(body)
    assert rows[1].startswith("..A") and rows[2].startswith("...")  # the agent moved up
    # In correct mode another pick replaces the correction instead of adding a step.
    body = annotator_client.get(
        intervene_url(project, trajectory), {"corrected_action": "up", "pick": "left"}, **HX
    ).content.decode()
    assert 'name="corrected_action" value="left"' in body and 'name="takeover_actions"' not in body


def test_takeover_plays_several_actions_and_undo_takes_the_last_back(annotator_client, project, trajectory):
    url = intervene_url(project, trajectory)
    body = annotator_client.get(url, {"switch": "takeover", "mode": "correct"}, **HX).content.decode()
    assert 'name="mode" value="takeover"' in body
    body = annotator_client.get(url, {"mode": "takeover", "pick": "up"}, **HX).content.decode()
    assert 'name="corrected_action" value="up"' in body
    body = annotator_client.get(
        url, {"mode": "takeover", "corrected_action": "up", "pick": "right"}, **HX
    ).content.decode()
    assert re.findall(r'name="takeover_actions" value="(\w+)"', body) == ["right"]
    assert grid_rows(body)[1].startswith("...A")
    body = annotator_client.get(
        url, {"mode": "takeover", "corrected_action": "up", "takeover_actions": ["right"], "undo": "1"}, **HX
    ).content.decode()
    assert 'name="takeover_actions"' not in body and 'name="corrected_action" value="up"' in body


def test_a_typed_illegal_action_is_shown_beside_the_field_while_playing(annotator_client, project, trajectory):
    response = annotator_client.get(intervene_url(project, trajectory), {"corrected_action": "jump"}, **HX)
    body = assert_refused(response, "'jump' is not a legal action")
    assert 'name="corrected_action" value="jump"' in body
    assert 'name="pick" value="up"' in body  # the legal actions are still offered
    assert "Before step 3" in body  # and the state shown is the step's own


def test_an_unknown_step_gets_404(annotator_client, project, trajectory):
    assert annotator_client.get(intervene_url(project, trajectory, 99)).status_code == 404
    assert submit(annotator_client, project, trajectory, 99, corrected_action="up").status_code == 404


# Submitting --------------------------------------------------------------------------------------------------------


def test_a_correction_is_stored_its_continuation_enqueued_and_the_page_goes_to_its_status(
    annotator_client, annotator, project, trajectory, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        response = submit(
            annotator_client,
            project,
            trajectory,
            mode="correct",
            corrected_action="up",
            corrected_reasoning="The goal is up; go up first.",
            reason="Down leads away from the goal.",
        )
    assert response.status_code == 200
    intervention = Intervention.objects.get()
    assert response["HX-Redirect"] == status_url(project, intervention)
    assert (intervention.annotator, intervention.step.index) == (annotator, FIRST_WRONG_INDEX)
    assert (intervention.original_action, intervention.corrected_action) == ("down", "up")
    assert intervention.reason == "Down leads away from the goal."
    assert intervention.takeover_actions == [] and intervention.status == "pending"
    assert len(callbacks) == 1  # the continuation task, sent once the transaction commits


def test_a_takeover_is_stored_with_its_hand_played_actions(annotator_client, project, trajectory):
    response = submit(
        annotator_client,
        project,
        trajectory,
        mode="takeover",
        corrected_action="up",
        takeover_actions=["right", "right"],
        reason="I will show it.",
    )
    assert response.status_code == 200
    assert Intervention.objects.get().takeover_actions == ["right", "right"]


def test_without_htmx_a_correction_redirects_to_its_status_page(annotator_client, project, trajectory):
    response = annotator_client.post(
        intervene_url(project, trajectory), {"corrected_action": "up", "client_token": str(uuid.uuid4())}
    )
    assert response.status_code == 303
    assert response["Location"] == status_url(project, Intervention.objects.get())


@pytest.mark.parametrize(
    ("data", "field_message"),
    [
        ({"corrected_action": "fly"}, "'fly' is not a legal action"),
        ({"corrected_action": ""}, "Write or pick the corrected action."),
        ({"corrected_action": "down"}, "the action the policy took"),
        (
            {"mode": "takeover", "corrected_action": "up", "takeover_actions": ["right", "sideways"]},
            "'sideways' is not a legal action",
        ),
    ],
)
def test_an_illegal_correction_gets_400_beside_the_field_and_the_form_keeps_what_was_typed(
    annotator_client, project, trajectory, data, field_message
):
    response = submit(annotator_client, project, trajectory, reason="my reason stays", **data)
    body = assert_refused(response, field_message)
    assert body.lstrip().startswith('<form id="intervene-form"')
    assert ">my reason stays</textarea>" in body
    assert f'name="corrected_action" value="{data["corrected_action"]}"' in body
    assert not Intervention.objects.exists()


def test_takeover_actions_after_the_episode_ends_are_refused(annotator_client, project, task, external_policy):
    # From the start (row 3, column 1) "up" then five "right" reach the goal; a seventh action cannot be played.
    short = play_gridworld(task, external_policy, ["down", "down"])
    response = submit(
        annotator_client,
        project,
        short,
        0,
        mode="takeover",
        corrected_action="up",
        takeover_actions=["right", "right", "right", "right", "right", "left"],
    )
    assert_refused(response, "cannot be played")


def test_a_double_submit_stores_one_intervention(annotator_client, project, trajectory):
    data = {"corrected_action": "up", "client_token": str(uuid.uuid4())}
    first = submit(annotator_client, project, trajectory, **data)
    second = submit(annotator_client, project, trajectory, **data)
    assert first["HX-Redirect"] == second["HX-Redirect"]
    assert Intervention.objects.count() == 1


def test_a_project_without_interventions_refuses_them(annotator_client, project, trajectory):
    project.feedback_kinds = ["step_label"]
    project.save()
    response = submit(annotator_client, project, trajectory, corrected_action="up")
    assert_refused(response, "does not collect interventions")
    steps_page = annotator_client.get(reverse("trajectory-steps", args=[project.pk, trajectory.pk])).content.decode()
    assert 'data-row-key="i"' not in steps_page


def test_an_outsider_gets_404_for_the_intervene_and_status_pages(client, outsider, annotator, project, trajectory):
    intervention = store_intervention(annotator, trajectory)
    client.force_login(outsider)
    assert client.get(intervene_url(project, trajectory)).status_code == 404
    assert submit(client, project, trajectory, corrected_action="up").status_code == 404
    assert client.get(status_url(project, intervention)).status_code == 404
    assert Intervention.objects.count() == 1


# The status page ---------------------------------------------------------------------------------------------------


def test_the_status_polls_every_second_while_pending(annotator_client, annotator, project, trajectory):
    intervention = store_intervention(annotator, trajectory, reason="left is shorter")
    response = annotator_client.get(status_url(project, intervention))
    assert response.status_code == 200
    body = response.content.decode()
    assert re.search(rf'id="intervention-{intervention.pk}-status"[^>]*hx-trigger="every 1s"', body, re.S)
    assert "Waiting for a rollout worker" in body and "left is shorter" in body
    fragment = annotator_client.get(status_url(project, intervention), **HX).content.decode()
    assert fragment.lstrip().startswith(f'<section id="intervention-{intervention.pk}-status"')
    assert "<html" not in fragment


def finish_with_child(intervention, trajectory, task, actions):
    child = play_gridworld(task, trajectory.policy_version, actions)
    Trajectory.objects.filter(pk=child.pk).update(parent=trajectory, branch_step_index=intervention.step.index)
    child.refresh_from_db()
    intervention.child_trajectory = child
    intervention.status = "done"
    intervention.save(update_fields=["child_trajectory", "status"])
    return child


def test_when_done_the_status_stops_polling_and_shows_the_child_with_the_human_steps_marked(
    annotator_client, annotator, project, task, trajectory
):
    intervention = store_intervention(annotator, trajectory, takeover_actions=["right"])
    child = finish_with_child(intervention, trajectory, task, ["right", "right", "up", "right", "right", "right"])
    body = annotator_client.get(status_url(project, intervention), **HX).content.decode()
    assert "hx-trigger" not in body
    assert f"Trajectory {child.pk}, 6 steps" in body
    origins = re.findall(r'<div class="child-step (by-human|from-parent|by-policy)">', body)
    assert origins == ["from-parent", "from-parent", "by-human", "by-human", "by-policy", "by-policy"]
    assert "Steps 3–4 are yours" in body
    assert "success" not in body and "reward" not in body  # hidden from the annotator


def test_a_researcher_sees_the_childs_outcome(client, researcher, annotator, project, task, trajectory):
    intervention = store_intervention(annotator, trajectory)
    finish_with_child(intervention, trajectory, task, ["right", "right", "up", "right", "right", "right"])
    client.force_login(researcher)
    body = client.get(status_url(project, intervention)).content.decode()
    assert "success" in body


def test_a_failed_continuation_shows_its_error_and_stops_polling(annotator_client, annotator, project, trajectory):
    intervention = store_intervention(annotator, trajectory)
    intervention.status, intervention.error = "failed", "No policy can continue this trajectory."
    intervention.save(update_fields=["status", "error"])
    body = annotator_client.get(status_url(project, intervention), **HX).content.decode()
    assert "hx-trigger" not in body and "No policy can continue this trajectory." in body


def test_only_the_author_and_researchers_see_an_intervention(
    client, annotator, other_annotator, researcher, project, trajectory
):
    intervention = store_intervention(annotator, trajectory)
    client.force_login(other_annotator)
    assert client.get(status_url(project, intervention)).status_code == 404
    assert client.get(status_url(project, intervention), **HX).status_code == 404
    client.force_login(researcher)
    assert client.get(status_url(project, intervention)).status_code == 200


def test_another_annotators_interventions_are_not_listed_on_the_intervene_page(
    client, annotator, other_annotator, project, trajectory
):
    store_intervention(other_annotator, trajectory, corrected_action="left")
    client.force_login(annotator)
    body = client.get(intervene_url(project, trajectory)).content.decode()
    assert "Your earlier interventions" not in body


# Cost --------------------------------------------------------------------------------------------------------------


def test_the_pages_make_the_same_number_of_queries_for_3_and_12_steps(
    client, annotator, project, task, make_trajectory, django_assert_max_num_queries
):
    client.force_login(annotator)
    counts = {"intervene": [], "status": []}
    for n_steps in (3, 12):
        trajectory = make_trajectory(n_steps, task=task)
        intervention = labelling.intervene(annotator, trajectory, step_index=1, corrected_action="down").label
        child = make_trajectory(n_steps, task=task, parent=trajectory, branch_step_index=1)
        intervention.child_trajectory, intervention.status = child, "done"
        intervention.save(update_fields=["child_trajectory", "status"])
        with django_assert_max_num_queries(15) as captured:
            assert client.get(reverse("intervene", args=[project.pk, trajectory.pk, 1])).status_code == 200
        counts["intervene"].append(len(captured.captured_queries))
        with django_assert_max_num_queries(10) as captured:
            assert client.get(status_url(project, intervention)).content.decode().count('class="child-step') == n_steps
        counts["status"].append(len(captured.captured_queries))
    assert counts["intervene"][0] == counts["intervene"][1]
    assert counts["status"][0] == counts["status"][1]
    assert Step.objects.filter(trajectory__parent__isnull=False).count() == 15
