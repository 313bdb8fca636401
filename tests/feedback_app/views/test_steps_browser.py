"""The step-label page in real Chromium: keyboard labelling with "first error here", a span critique made by
selecting text in a step's reasoning and sent by Ctrl+Enter, a rating by keys stored as one revision, then submit &
next."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback_app.models import Assignment, Critique, QueueItem, Rating, StepLabel
from feedback_app.models.queue import AssignmentStatus
from tests.feedback_app.gridworld_play import FIRST_WRONG_INDEX, SEED_7_ACTIONS, play_gridworld

pytestmark = pytest.mark.browser

SELECT_IN_FIELD = """([selector, start, end]) => {
  const text = document.querySelector(selector).firstChild;
  const range = document.createRange();
  range.setStart(text, start);
  range.setEnd(text, end);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}"""


@pytest.fixture
def label_page(browser_page_for, annotator, project, task, external_policy):
    """`label_page(actions)`: the gridworld episode `actions` play, queued for step labels, and the annotator's
    step-label page open on it with the first step focused; returns the page and the episode's steps."""

    def open_page(actions):
        trajectory = play_gridworld(task, external_policy, actions)
        QueueItem.objects.enqueue_trajectories(project, [trajectory])
        steps = list(trajectory.steps.order_by("index"))
        page = browser_page_for(annotator)
        page.goto(reverse("label-next", args=[project.pk]))
        page.wait_for_selector(f"#step-{steps[0].pk}-row.focused")
        return page, steps

    return open_page


def test_first_error_by_keyboard_and_a_span_critique_by_selecting_text(label_page, annotator, docs_dir):
    page, steps = label_page(SEED_7_ACTIONS)

    # j j moves the focus to step 3, f marks it as the first error.
    page.keyboard.press("j")
    page.keyboard.press("ArrowDown")
    page.wait_for_selector(f"#step-{steps[FIRST_WRONG_INDEX].pk}-row.focused")
    page.keyboard.press("f")
    page.wait_for_selector(f"#step-{steps[0].pk}-label .label-good[aria-pressed=true]")
    page.wait_for_selector(f"#step-{steps[FIRST_WRONG_INDEX].pk}-label .label-bad[aria-pressed=true]")
    labels = dict(StepLabel.objects.filter(annotator=annotator, is_current=True).values_list("step__index", "value"))
    assert labels == {0: 1, 1: 1, 2: -1}

    # c points the critique form at the focused step and puts the cursor in it; g at the whole trajectory.
    page.keyboard.press("c")
    assert page.evaluate("document.activeElement.id") == "critique-text"
    assert page.input_value("#critique-anchor") == str(FIRST_WRONG_INDEX)
    page.keyboard.press("Escape")
    page.keyboard.press("g")
    assert page.input_value("#critique-anchor") == ""
    page.keyboard.press("Escape")

    # Select "move down" in step 3's reasoning with a selection range, as a mouse drag would.
    wrong = steps[FIRST_WRONG_INDEX]
    start = wrong.reasoning.index("move down")
    end = start + len("move down")
    page.evaluate(SELECT_IN_FIELD, [f"#step-{wrong.pk}-row [data-span-field=reasoning]", start, end])
    page.wait_for_function("document.getElementById('critique-span-end').value !== ''")
    assert page.text_content("#critique-span-text") == "move down"
    page.fill("#critique-text", "The goal is up; moving down walks away from it.")
    page.check("input[name=tags][value='wrong direction']")
    page.focus("#critique-text")
    page.keyboard.press("Control+Enter")  # sent from the text box by keyboard
    page.wait_for_selector(".critique-list li")

    critique = Critique.objects.get(annotator=annotator)
    assert (critique.step, critique.span_field) == (wrong, "reasoning")
    assert (critique.span_start, critique.span_end) == (start, end)
    assert wrong.reasoning[critique.span_start : critique.span_end] == "move down"
    assert critique.tags == ["wrong direction"]

    # Past the last step the focus reaches the rating, where 4, u and Enter rate the trajectory: one revision.
    page.keyboard.press("Escape")
    for _ in range(len(steps) - FIRST_WRONG_INDEX):
        page.keyboard.press("j")
    page.wait_for_selector("#rating.focused")
    page.keyboard.press("4")
    page.keyboard.press("u")
    assert page.is_checked("#rating input[name=score][value='4']")
    assert page.is_checked("#rating input[name=thumb][value=up]")
    assert not Rating.objects.filter(annotator=annotator).exists()  # picked, not yet saved
    page.keyboard.press("Enter")
    page.wait_for_selector("#rating .rating-saved")
    rating = Rating.objects.get(annotator=annotator)
    assert (rating.score, rating.thumb_up, rating.revision) == (4, True, 1)
    assert page.is_disabled("#rating .rating-save")  # saved: Enter goes on to submit & next

    for _ in range(len(steps) - FIRST_WRONG_INDEX):
        page.keyboard.press("k")
    page.wait_for_selector(f"#step-{wrong.pk}-row.focused")
    page.evaluate(f"document.getElementById('step-{steps[1].pk}-row').scrollIntoView({{block: 'start'}})")
    page.screenshot(path=str(docs_dir / "steps.png"))

    page.keyboard.press("Enter")
    page.wait_for_selector("text=Nothing left to label")
    assert Assignment.objects.get(annotator=annotator).status == AssignmentStatus.DONE


def test_submitting_too_early_marks_the_unlabelled_steps(label_page):
    page, steps = label_page(SEED_7_ACTIONS[:3])
    page.keyboard.press("+")
    page.wait_for_selector(f"#step-{steps[0].pk}-label .label-good[aria-pressed=true]")
    page.wait_for_selector(f"#step-{steps[1].pk}-row.focused")  # a label moves the focus on
    page.keyboard.press("k")
    page.wait_for_selector(f"#step-{steps[0].pk}-row.focused")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#step-{steps[1].pk}-label.needs-label")
    assert page.is_visible("text=Label steps 2, 3 first")
    assert not page.is_visible(f"#step-{steps[0].pk}-label.needs-label")
