"""The intervene page on a chat trajectory with tools: the policy's turn is edited as text and tool calls, each call's
tool picked from the task's and its arguments typed one field per schema property, each error beside its field and the
typed text kept; taking over, the annotator plays turns one by one, sees what their tools answer, undoes, and hands
them all in; a trajectory the environment cannot replay says so, with no form and no server error."""

from __future__ import annotations

import html
import json
import re
import uuid

import pytest
from django.urls import reverse

from feedback_app.models import Intervention
from tests.feedback_app.views.conftest import assert_refused, field_errors

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def url(project, trajectory, index=1):
    return reverse("intervene", args=[project.pk, trajectory.pk, index])


# The editor's fields for the shop's call that puts two red mugs in the cart, and for checking out.
ADD_TWO = {
    "content": "",
    "call_count": "1",
    "call-0-name": "add_to_cart",
    "call-0-arg-item_id": "kq48",
    "call-0-arg-quantity": "2",
}
CHECKOUT = {"content": "Placing the order.", "call_count": "1", "call-0-name": "checkout"}


def test_the_editor_offers_the_task_s_tools_and_one_field_per_argument(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    page = client.get(url(project, trajectory)).content.decode()
    # The editor opens on the policy's own turn, to be edited: its call to add_to_cart, the quantity it left out.
    assert 'name="content"' in page and 'name="call_count" value="1"' in page
    assert '<option value="add_to_cart" selected>' in page
    assert 'name="call-0-arg-item_id" value="kq48"' in page and 'name="call-0-arg-quantity" value=""' in page
    assert "add a tool call" in page and 'name="corrected_action"' not in page  # no legal-action picker
    panel = client.get(url(project, trajectory), {"call_count": "0", "content": "kept", "add_call": "1"}, **HX)
    body = panel.content.decode()
    assert (
        panel.status_code == 200
        and body.lstrip().startswith('<div id="intervene-play"')
        and ">kept</textarea>" in body
    )
    names = re.findall(r'<option value="([a-z_]+)"', body)
    assert names == ["search", "get_item", "add_to_cart", "remove_from_cart", "view_cart", "checkout"]
    # The first tool is picked; picking another re-renders its fields, keeping what was typed in one they share.
    picked = client.get(
        url(project, trajectory),
        {"call_count": "1", "call-0-name": "add_to_cart", "call-0-arg-item_id": "kq48", "content": ""},
        **HX,
    ).content.decode()
    assert 'id="call-0-arg-item_id" name="call-0-arg-item_id" value="kq48"' in picked
    assert 'for="call-0-arg-quantity">quantity <span class="muted">(required)</span>' in picked
    removed = client.get(
        url(project, trajectory), {"call_count": "1", "call-0-name": "search", "remove_call": "0"}, **HX
    ).content.decode()
    assert 'name="call_count" value="0"' in removed


@pytest.mark.parametrize(
    ("quantity", "message"),
    [("two", "quantity: a whole number, not 'two'"), ("99", "quantity: 99 is above the maximum 9")],
)
def test_a_bad_argument_gets_400_beside_its_field_and_the_typed_text_stays(client, annotator, shop, quantity, message):
    project, trajectory, _ = shop
    client.force_login(annotator)
    data = {
        "client_token": str(uuid.uuid4()),
        **ADD_TWO,
        "content": "Adding two mugs.",
        "call-0-arg-quantity": quantity,
        "reason": "the quantity was missing",
    }
    response = client.post(url(project, trajectory), data, **HX)
    body = response.content.decode()
    assert response.status_code == 400
    assert message in field_errors(body)
    assert f'hx-post="{url(project, trajectory)}"' in body  # the re-rendered form still posts to this page
    field = body[body.index('id="call-0-arg-quantity"') :]
    assert f'value="{quantity}"' in field[: field.index(">")] and ">Adding two mugs.</textarea>" in body
    assert not Intervention.objects.exists()


def test_a_corrected_tool_call_is_stored_verbatim_and_continued(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    data = {"client_token": str(uuid.uuid4()), **ADD_TWO, "reason": "the quantity was missing"}
    response = client.post(url(project, trajectory), data, **HX)
    assert response.status_code == 200 and "HX-Redirect" in response.headers
    intervention = Intervention.objects.get()
    [call] = intervention.corrected_message["tool_calls"]
    assert call["function"]["name"] == "add_to_cart"
    assert json.loads(call["function"]["arguments"]) == {"item_id": "kq48", "quantity": 2}
    assert intervention.reason == "the quantity was missing" and intervention.step.index == 1


def test_a_free_text_turn_is_a_correction_too(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    data = {"client_token": str(uuid.uuid4()), "content": "How many mugs do you want?", "call_count": "0"}
    assert client.post(url(project, trajectory), data, **HX).status_code == 200
    assert Intervention.objects.get().corrected_message == {"role": "assistant", "content": data["content"]}


def test_an_unknown_tool_is_refused_beside_the_call(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    data = {"client_token": str(uuid.uuid4()), "call_count": "1", "call-0-name": "launch_rockets"}
    # An unknown name falls back to the first tool, whose required argument is then missing.
    body = client.post(url(project, trajectory), data, **HX).content.decode()
    assert "query: required field missing" in field_errors(body)


def test_a_trajectory_without_a_seed_or_spec_says_why_it_cannot_be_continued(client, annotator, shop):
    project, _, bare = shop
    client.force_login(annotator)
    page = client.get(url(project, bare))
    body = page.content.decode()
    assert page.status_code == 200 and "This trajectory cannot be continued" in body
    assert "imported without its task's seed or spec" in html.unescape(body)
    assert 'id="intervene-form"' not in body
    assert reverse("trajectory-steps", args=[project.pk, bare.pk]) in body
    posted = client.post(url(project, bare), {"content": "hello", "call_count": "0"}, **HX)
    assert posted.status_code == 400 and not Intervention.objects.exists()


def played_turns(body: str) -> list[dict]:
    return [
        json.loads(html.unescape(raw))
        for raw in re.findall(r'<input type="hidden" name="played" value="([^"]*)"', body)
    ]


def test_taking_over_plays_turns_one_by_one_shows_their_results_and_hands_them_all_in(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    page = url(project, trajectory)
    switched = client.get(page, {"mode": "correct", "switch": "takeover", **ADD_TWO}, **HX).content.decode()
    assert 'name="mode" value="takeover"' in switched and "play this turn" in switched and not played_turns(switched)

    # Playing the corrected turn: it is replayed, shown with the shop's answer, and the editor moves on to step 3.
    first = client.get(page, {"mode": "takeover", "play_turn": "1", **ADD_TWO}, **HX)
    body = first.content.decode()
    assert first.status_code == 200
    [turn] = played_turns(body)
    assert json.loads(turn["tool_calls"][0]["function"]["arguments"]) == {"item_id": "kq48", "quantity": 2}
    card = body[body.index('id="played-2"') :]
    assert "<strong>Step 2</strong>" in card and '<div class="tool-result"><span class="role">result</span>' in card
    assert "The assistant's turn at step 3" in body and 'name="call_count" value="0"' in body

    # A bad argument is refused beside its field, with 400, and nothing joins the played turns.
    bad = {"mode": "takeover", "play_turn": "1", "played": json.dumps(turn), **ADD_TWO, "call-0-arg-quantity": "0"}
    refused = client.get(page, bad, **HX)
    assert refused.status_code == 400
    assert "quantity: 0 is below the minimum 1" in field_errors(refused.content.decode())
    assert played_turns(refused.content.decode()) == [turn]

    # Undo puts the last played turn back in the editor.
    undone = client.get(page, {"mode": "takeover", "undo": "1", "played": json.dumps(turn), **CHECKOUT}, **HX)
    body = undone.content.decode()
    assert not played_turns(body) and 'name="call-0-arg-quantity" value="2"' in body
    assert "The assistant's turn at step 2" in body

    # Handing in: the played turn is the correction, the editor's turn the takeover after it.
    data = {"client_token": str(uuid.uuid4()), "mode": "takeover", "played": json.dumps(turn), "reason": "r"}
    response = client.post(page, {**data, **CHECKOUT}, **HX)
    assert response.status_code == 200 and "HX-Redirect" in response.headers
    intervention = Intervention.objects.get()
    assert intervention.corrected_message == turn
    [checkout] = intervention.takeover_actions
    assert checkout["content"] == "Placing the order." and checkout["tool_calls"][0]["function"]["name"] == "checkout"


def test_a_turn_that_ends_the_episode_closes_the_editor_and_is_handed_in_as_it_is(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    page = url(project, trajectory)
    answer = {"content": "Your mugs are in the cart.", "call_count": "0"}  # a turn without a call ends the episode
    ended = client.get(page, {"mode": "takeover", "play_turn": "1", **answer}, **HX).content.decode()
    assert "The episode ends after your turn at step 2" in ended and 'id="turn-content"' not in ended
    assert "play this turn" not in ended
    [turn] = played_turns(ended)
    data = {"client_token": str(uuid.uuid4()), "mode": "takeover", "played": json.dumps(turn), "call_count": "0"}
    assert client.post(page, data, **HX).status_code == 200
    intervention = Intervention.objects.get()
    assert intervention.corrected_message == {"role": "assistant", "content": answer["content"]} == turn
    assert intervention.takeover_actions == []


def test_stopping_a_takeover_keeps_the_correction_in_the_editor(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    turn = {"role": "assistant", "content": "Adding them.", "tool_calls": []}
    params = {"mode": "takeover", "switch": "correct", "played": json.dumps(turn), **CHECKOUT}
    body = client.get(url(project, trajectory), params, **HX).content.decode()
    assert 'name="mode" value="correct"' in body and not played_turns(body)
    assert ">Adding them.</textarea>" in body and 'name="call_count" value="0"' in body


@pytest.mark.parametrize("played", ["{not json", json.dumps({"role": "user", "content": "hi"}), json.dumps([1])])
def test_a_garbled_played_turn_is_refused_and_nothing_is_stored(client, annotator, shop, played):
    project, trajectory, _ = shop
    client.force_login(annotator)
    data = {"client_token": str(uuid.uuid4()), "mode": "takeover", "played": played, **CHECKOUT}
    response = client.post(url(project, trajectory), data, **HX)
    assert_refused(response, "A turn you played came back garbled")
    assert not Intervention.objects.exists()


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": None, "tool_calls": 7},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": ["x"], "arguments": "[1]"}}]},
        {"role": "assistant", "content": 'Adding.\n<tool_call>\n{"name": "view_cart", "arguments": {}}\n</tool_call>'},
    ],
)
def test_the_editor_opens_on_any_stored_turn_without_an_error(message):
    from feedback_app.views.chat_turn import editor_from_message
    from reward_models.envs.toolshop_tools import TOOLS

    editor = editor_from_message(message, TOOLS)
    assert editor.tools[0] == "search" and not editor.has_errors
    if "<tool_call>" in (message["content"] or ""):
        assert editor.content == "Adding." and [call.name for call in editor.calls] == ["view_cart"]
