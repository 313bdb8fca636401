"""A chat trajectory with tool calls in real Chromium: the step page shows each call with its result beside it and
its raw JSON one click away, step labels go by keyboard as on the gridworld, and the intervene page corrects the
policy's tool call field by field, the error beside its field and the typed text kept, then takes over for a turn."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from feedback_app.models import Comparison, Critique, Intervention, QueueItem, StepLabel
from reward_models.envs.toolshop_tools import TOOLS
from tests.feedback_app.conftest import TRANSCRIPT, _call

ADD = '{"item_id": "kq48", "quantity": 2}'

pytestmark = pytest.mark.browser


def test_an_annotator_labels_and_corrects_a_tool_calling_trajectory(browser_page_for, annotator, shop, docs_dir):
    project, trajectory, _ = shop
    QueueItem.objects.enqueue_trajectories(project, [trajectory])
    steps = list(trajectory.steps.order_by("index"))
    page = browser_page_for(annotator)
    console_errors = []
    page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    page.goto(reverse("label-next", args=[project.pk]))
    page.wait_for_selector(f"#step-{steps[0].pk}-row.focused")

    # The first turn's call, its result beside it, and the raw call one click away.
    first = page.locator(f"#step-{steps[0].pk} .tool-exchange")
    assert first.locator(".tool-call code").first.inner_text() == "search"
    assert first.locator(".tool-arguments dt").inner_text() == "query"
    assert "red mug" in first.locator(".tool-result").inner_text()
    first.locator("summary").click()
    raw = json.loads(first.locator("details pre").inner_text())
    assert raw["function"] == {"name": "search", "arguments": '{"query": "mug"}'}

    # +1 on the first turn moves on to the second, which is marked bad.
    page.keyboard.press("+")
    page.wait_for_selector(f"#step-{steps[1].pk}-row.focused")
    page.keyboard.press("-")
    page.wait_for_selector(f"#step-{steps[1].pk}-label .label-bad[aria-pressed=true]")
    labels = dict(StepLabel.objects.filter(annotator=annotator, is_current=True).values_list("step__index", "value"))
    assert labels == {0: 1, 1: -1}
    page.screenshot(path=str(docs_dir / "chat-steps.png"))

    # Intervene on the second turn: the editor holds the policy's call to add_to_cart, whose quantity is missing;
    # it is first typed wrong.
    page.click(f"#step-{steps[1].pk} header")
    page.wait_for_selector(f"#step-{steps[1].pk}-row.focused")
    page.keyboard.press("i")
    page.wait_for_url(f"**{reverse('intervene', args=[project.pk, trajectory.pk, 1])}?assignment=*")
    assert page.input_value("#call-0-name") == "add_to_cart" and page.input_value("#call-0-arg-item_id") == "kq48"
    page.fill("#call-0-arg-quantity", "two")
    page.fill("#intervene-reason", "It forgot the quantity.")
    page.click("#intervene-form button[type=submit]")
    page.wait_for_selector("text=quantity: a whole number, not 'two'")
    assert page.input_value("#call-0-arg-quantity") == "two"  # what was typed stays
    assert page.input_value("#intervene-reason") == "It forgot the quantity."
    page.screenshot(path=str(docs_dir / "intervene-chat.png"), full_page=True)

    # Take over: play the corrected turn, see what the shop answers, and write the next turn by hand.
    page.fill("#call-0-arg-quantity", "2")
    page.keyboard.press("Escape")
    page.keyboard.press("t")
    page.wait_for_selector("button[name=play_turn]")
    page.keyboard.press("p")
    page.wait_for_selector("#played-2 .tool-result")
    page.wait_for_selector("text=The assistant's turn at step 3")
    page.fill("#turn-content", "Your two red mugs are in the cart.")
    page.screenshot(path=str(docs_dir / "intervene-takeover-chat.png"), full_page=True)

    # The page's own 400 is logged by Chromium as a failed resource; nothing else may be.
    assert [text for text in console_errors if "status of 400" not in text] == []
    page.click("#intervene-form button[type=submit]")
    page.wait_for_url("**/interventions/*/")
    intervention = Intervention.objects.get()
    [call] = intervention.corrected_message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"item_id": "kq48", "quantity": 2}
    assert intervention.takeover_actions == [{"role": "assistant", "content": "Your two red mugs are in the cart."}]


def test_an_annotator_compares_and_critiques_tool_calling_trajectories_by_keyboard(
    browser_page_for, api_as, annotator, researcher, shop, docs_dir
):
    project, seeded, _ = shop
    project.gold_fraction = 0
    project.save()
    # A second try at the seeded task, whose add_to_cart call has its quantity.
    messages = [*TRANSCRIPT[:4], {**TRANSCRIPT[4], "tool_calls": [_call("call_b", "add_to_cart", ADD)]}]
    row = {"external_id": "again", "task": {"external_id": "shop-3"}, "messages": messages, "tools": TOOLS}
    imported = api_as(researcher).post(
        f"/api/projects/{project.pk}/trajectories/import", json.dumps([row]), content_type="application/json"
    )
    assert imported.status_code == 200, imported.content
    QueueItem.objects.enqueue_comparisons(project, [(seeded, project.trajectories.get(external_id="again"))])
    page = browser_page_for(annotator)
    page.goto(f"/projects/{project.pk}/compare/")
    page.wait_for_selector("#compare-form")
    # Both sides show their turns as calls with the results beside them.
    assert page.locator(".tool-exchange").count() == 4
    assert page.locator(".tool-call code", has_text="add_to_cart").count() == 2
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("r")
    page.keyboard.type("Left searched first.")
    page.keyboard.press("Escape")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(docs_dir / "compare-chat.png"))
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Nothing left to compare")
    comparison = Comparison.objects.get(annotator=annotator)
    assert comparison.rationale == "Left searched first." and comparison.choice in ("a", "b")

    # A critique anchored to the second turn, by keyboard from the step page.
    QueueItem.objects.enqueue_trajectories(project, [seeded])
    steps = list(seeded.steps.order_by("index"))
    page.goto(reverse("label-next", args=[project.pk]))
    page.wait_for_selector(f"#step-{steps[0].pk}-row.focused")
    page.keyboard.press("j")
    page.wait_for_selector(f"#step-{steps[1].pk}-row.focused")
    page.keyboard.press("c")
    assert page.input_value("#critique-anchor") == "1"
    page.keyboard.type("The call has no quantity.")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector(".critique-list li")
    critique = Critique.objects.get(annotator=annotator)
    assert (critique.step, critique.text) == (steps[1], "The call has no quantity.")
