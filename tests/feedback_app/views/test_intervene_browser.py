"""An intervention in real Chromium, continued by a real Celery worker: the annotator corrects a step with the
keyboard, takes over for one more step, hands back to the policy, and the status fragment shows the child."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback_app.models import Intervention
from tests.feedback_app.gridworld_play import FIRST_WRONG_INDEX, SEED_7_ACTIONS, play_gridworld

pytestmark = [pytest.mark.browser, pytest.mark.worker]


def test_an_intervention_is_continued_by_the_worker_and_its_child_appears_in_the_page(
    celery_worker_process, browser_page_for, annotator, project, task, tiny_policy, docs_dir
):
    trajectory = play_gridworld(task, tiny_policy, SEED_7_ACTIONS)
    page = browser_page_for(annotator)
    console_errors = []
    page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    page.goto(reverse("trajectory-steps", args=[project.pk, trajectory.pk]))
    page.wait_for_selector(".step-row.focused")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("i")  # intervene at the focused step 3
    page.wait_for_url(f"**{reverse('intervene', args=[project.pk, trajectory.pk, FIRST_WRONG_INDEX])}")

    page.keyboard.press("w")  # up instead of down
    page.wait_for_selector("#corrected-action[value='up']")
    page.keyboard.press("t")  # take over ...
    page.wait_for_selector("input[name=mode][value=takeover]", state="attached")
    page.keyboard.press("ArrowRight")  # ... and play one more step by hand
    page.wait_for_selector("input[name=takeover_actions][value=right]", state="attached")
    assert console_errors == []  # every move swapped its panel cleanly
    page.fill("#intervene-reason", "Down walks away from the goal; up then right heads for it.")
    page.keyboard.press("Escape")
    page.keyboard.press("Enter")  # hand back to the policy

    page.wait_for_url("**/interventions/*/")
    page.wait_for_selector(".child-steps", timeout=180_000)
    intervention = Intervention.objects.get()
    assert intervention.status == "done", f"{intervention.error}\n{celery_worker_process.log_path.read_text()}"
    child = intervention.child_trajectory
    assert (child.parent_id, child.branch_step_index) == (trajectory.pk, FIRST_WRONG_INDEX)
    actions = list(child.steps.order_by("index").values_list("action", flat=True))
    assert actions[: FIRST_WRONG_INDEX + 2] == [*SEED_7_ACTIONS[:FIRST_WRONG_INDEX], "up", "right"]
    assert page.locator(".child-step.by-human").count() == 2
    assert page.locator(".child-step").count() == child.num_steps
    assert page.get_attribute(f"#intervention-{intervention.pk}-status", "hx-trigger") is None  # polling stopped
    assert intervention.reason.startswith("Down walks away")

    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(docs_dir / "intervene.png"))


# Clicks the "right" button from inside the task that swapped the take-over form in, before any timer could run: a
# key pressed in the gap between htmx's swap and its settle used to hit a button with no handler yet, and was lost.
PRESS_RIGHT_THE_MOMENT_TAKEOVER_LANDS = """() => {
    new MutationObserver((records, observer) => {
        const right = document.querySelector("#intervene-play button[name=pick][value=right]");
        if (!right || !document.querySelector("input[name=mode][value=takeover]")) return;
        observer.disconnect();
        document.body.dispatchEvent(new KeyboardEvent("keydown", {key: "ArrowRight", bubbles: true}));
    }).observe(document.body, {childList: true, subtree: true});
}"""


def test_a_key_pressed_the_moment_a_swap_lands_is_not_lost(browser_page_for, annotator, project, task, tiny_policy):
    trajectory = play_gridworld(task, tiny_policy, SEED_7_ACTIONS)
    page = browser_page_for(annotator)
    page.goto(reverse("intervene", args=[project.pk, trajectory.pk, FIRST_WRONG_INDEX]))
    page.keyboard.press("w")
    page.wait_for_selector("#corrected-action[value='up']")
    page.evaluate(PRESS_RIGHT_THE_MOMENT_TAKEOVER_LANDS)
    page.keyboard.press("t")
    page.wait_for_selector("input[name=takeover_actions][value=right]", state="attached", timeout=10_000)
    assert page.locator(".played-list li code").all_inner_texts() == ["up", "right"]
