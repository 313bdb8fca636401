"""A chat trajectory with tool calls in real Chromium: the step page shows each call with its result beside it and
its raw JSON one click away, step labels go by keyboard as on the gridworld, and the intervene page corrects a tool
call field by field, the error beside its field and the typed text kept."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from feedback_app import queue
from feedback_app.models import Intervention, StepLabel

pytestmark = pytest.mark.browser


def test_an_annotator_labels_and_corrects_a_tool_calling_trajectory(browser_page_for, annotator, shop, docs_dir):
    project, trajectory, _ = shop
    queue.enqueue_trajectories(project, [trajectory])
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

    # Intervene on the second turn: a call to add_to_cart, its quantity first typed wrong.
    page.click(f"#step-{steps[1].pk} header")
    page.wait_for_selector(f"#step-{steps[1].pk}-row.focused")
    page.keyboard.press("i")
    page.wait_for_url(f"**{reverse('intervene', args=[project.pk, trajectory.pk, 1])}?assignment=*")
    page.keyboard.press("a")  # add a tool call
    page.wait_for_selector("#call-0-name")
    page.select_option("#call-0-name", "add_to_cart")
    page.wait_for_selector("#call-0-arg-quantity")
    page.fill("#call-0-arg-item_id", "kq48")
    page.fill("#call-0-arg-quantity", "two")
    page.fill("#intervene-reason", "It forgot the quantity.")
    page.click("#intervene-form button[type=submit]")
    page.wait_for_selector("text=quantity: a whole number, not 'two'")
    assert page.input_value("#call-0-arg-quantity") == "two"  # what was typed stays
    assert page.input_value("#intervene-reason") == "It forgot the quantity."
    page.screenshot(path=str(docs_dir / "intervene-chat.png"), full_page=True)

    # The page's own 400 is logged by Chromium as a failed resource; nothing else may be.
    assert [text for text in console_errors if "status of 400" not in text] == []
    page.fill("#call-0-arg-quantity", "2")
    page.click("#intervene-form button[type=submit]")
    page.wait_for_url("**/interventions/*/")
    [call] = Intervention.objects.get().corrected_message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"item_id": "kq48", "quantity": 2}
