"""The intervene page on a chat trajectory with tools: the turn is edited as text and tool calls, each call's tool
picked from the task's and its arguments typed one field per schema property, each error beside its field and the
typed text kept; a trajectory the environment cannot replay says so, with no form and no server error."""

from __future__ import annotations

import html
import json
import re
import uuid

import pytest
from django.urls import reverse

from feedback_app.models import Intervention

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def url(project, trajectory, index=1):
    return reverse("intervene", args=[project.pk, trajectory.pk, index])


def errors_of(body: str) -> list[str]:
    return [html.unescape(text) for text in re.findall(r'<p class="field-error">([^<]*)</p>', body)]


def test_the_editor_offers_the_task_s_tools_and_one_field_per_argument(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    page = client.get(url(project, trajectory)).content.decode()
    assert 'name="content"' in page and 'name="call_count" value="0"' in page
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
        "content": "Adding two mugs.",
        "call_count": "1",
        "call-0-name": "add_to_cart",
        "call-0-arg-item_id": "kq48",
        "call-0-arg-quantity": quantity,
        "reason": "the quantity was missing",
    }
    response = client.post(url(project, trajectory), data, **HX)
    body = response.content.decode()
    assert response.status_code == 400
    assert message in errors_of(body)
    assert f'hx-post="{url(project, trajectory)}"' in body  # the re-rendered form still posts to this page
    field = body[body.index('id="call-0-arg-quantity"') :]
    assert f'value="{quantity}"' in field[: field.index(">")] and ">Adding two mugs.</textarea>" in body
    assert not Intervention.objects.exists()


def test_a_corrected_tool_call_is_stored_verbatim_and_continued(client, annotator, shop):
    project, trajectory, _ = shop
    client.force_login(annotator)
    data = {
        "client_token": str(uuid.uuid4()),
        "content": "",
        "call_count": "1",
        "call-0-name": "add_to_cart",
        "call-0-arg-item_id": "kq48",
        "call-0-arg-quantity": "2",
        "reason": "the quantity was missing",
    }
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
    assert "query: required field missing" in errors_of(body)


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
