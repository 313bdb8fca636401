"""The compare page in real Chromium: labelling with the keyboard only, keeping typed text through a server
failure, and the layout at desktop and phone widths (screenshots for the docs)."""

from __future__ import annotations

import random
import re

import pytest

from feedback_app import labelling
from feedback_app.models import Assignment, Comparison, QueueItem, Step, Trajectory
from feedback_app.models.queue import AssignmentStatus
from reward_models.envs.gridworld import GridWorld
from simulation.episodes import skilled_walk
from tests.trajectories import save_steps

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def gridworld_trajectory(project, task, policy, *, skill: float, seed: int) -> Trajectory:
    """A stored gridworld episode: the oracle's best move with probability `skill`, else a random one."""
    env = GridWorld()
    spec = env.make_task(task.seed)
    steps = skilled_walk(env, spec, random.Random(seed), skill)
    trajectory = Trajectory.objects.create(
        project=project,
        task=task,
        policy_version=policy,
        source="import",
        num_steps=len(steps),
        success=env.oracle(spec).success([action for _, _, action, _, _ in steps]),
    )
    save_steps(
        trajectory,
        [
            Step(
                index=index,
                observation=obs,
                reasoning="the goal is that way" if on_course else "try another way",
                action=action,
                env_reward=result.reward,
                done=result.done,
                render=env.render(obs),
            )
            for index, obs, action, on_course, result in steps
        ],
    )
    return trajectory


@pytest.fixture
def gridworld_pairs(project, task, external_policy):
    """Two comparisons of gridworld episodes of one task: a careful one against a sloppy one."""
    project.gold_fraction = 0
    project.guidelines = (
        "# Comparing trajectories\n\nPrefer the trajectory that **reaches the goal** `G` in fewer steps.\n\n"
        "- Bumping into walls `#` is a mistake.\n- Mark *both bad* when neither gets closer.\n"
    )
    project.save()
    careful = gridworld_trajectory(project, task, external_policy, skill=1.0, seed=1)
    sloppy = gridworld_trajectory(project, task, external_policy, skill=0.4, seed=2)
    third = gridworld_trajectory(project, task, external_policy, skill=0.7, seed=3)
    return QueueItem.objects.enqueue_comparisons(project, [(careful, sloppy), (careful, third)])


def open_compare(page, project):
    page.goto(f"/projects/{project.pk}/compare/")
    page.wait_for_selector("#compare-form")
    return current_assignment(page)


def current_assignment(page) -> Assignment:
    action = page.locator("#compare-form").get_attribute("action")
    return Assignment.objects.select_related("item").get(pk=int(re.search(r"/compare/(\d+)/", action).group(1)))


def wait_for_next_item(page, after: Assignment) -> None:
    page.wait_for_function(
        "pk => { const f = document.querySelector('#compare-form');"
        " return f !== null && !f.getAttribute('action').includes('/compare/' + pk + '/'); }",
        arg=after.pk,
    )


def test_a_comparison_is_labelled_with_the_keyboard_only(
    browser_page_for, annotator, project, gridworld_pairs, docs_dir
):
    page = browser_page_for(annotator)
    first = open_compare(page, project)
    assert page.locator(".gridmap").count() > 2 and page.get_by_text("episode ended").count() >= 1
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.locator("#row-1.current-row").count() == 1
    page.keyboard.press("k")
    assert page.locator("#row-0.current-row").count() == 1
    page.keyboard.press("ArrowRight")
    page.keyboard.press("e")
    page.keyboard.press("r")
    page.keyboard.type("Right reaches G without bumping walls.")
    page.keyboard.press("Escape")
    assert page.locator("input[name=choice][value=right]").is_checked()
    assert page.locator("input[name=strength][value='3']").is_checked()
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(docs_dir / "compare.png"))

    page.keyboard.press("Enter")
    wait_for_next_item(page, first)
    label = Comparison.objects.get(annotator=annotator)
    order = labelling.displayed_order(first)
    assert label.displayed_order == order
    assert label.choice == labelling.canonical_choice("right", order) == ("b" if order == "ab" else "a")
    assert (label.strength, label.rationale) == (3, "Right reaches G without bumping walls.")
    # The next item starts clean: no choice, strength back to 2, empty rationale.
    assert page.locator("input[name=choice]:checked").count() == 0
    assert page.locator("input[name=strength][value='2']").is_checked()
    assert page.locator("#rationale").input_value() == ""

    # Tie with the space bar, and a skip after it would find the queue empty.
    second = current_assignment(page)
    page.keyboard.press("t")
    page.keyboard.press(" ")
    page.wait_for_selector("text=Nothing left to compare")
    assert Comparison.objects.get(assignment=second).choice == "tie"
    assert Comparison.objects.filter(annotator=annotator).count() == 2


def test_skipping_with_a_reason_from_the_keyboard(browser_page_for, annotator, project, gridworld_pairs):
    page = browser_page_for(annotator)
    first = open_compare(page, project)
    page.keyboard.press("s")
    page.keyboard.type("maps look identical")
    page.keyboard.press("Enter")
    wait_for_next_item(page, first)
    first.refresh_from_db()
    assert (first.status, first.skip_reason) == (AssignmentStatus.SKIPPED, "maps look identical")
    # htmx followed the redirect as an htmx request: the workspace fragment was swapped in, not a whole page.
    assert page.locator("header.topbar").count() == 1 and page.locator("#workspace").count() == 1
    assert Comparison.objects.count() == 0


def test_the_form_keeps_its_text_when_the_server_fails(browser_page_for, annotator, project, gridworld_pairs):
    page = browser_page_for(annotator)
    first = open_compare(page, project)
    submit_pattern = re.compile(rf"/projects/{project.pk}/compare/{first.pk}/$")

    def fail_submit(route):
        if route.request.method == "POST":
            route.fulfill(status=500, body="Internal Server Error")
        else:
            route.continue_()

    page.route(submit_pattern, fail_submit)
    page.keyboard.press("1")
    page.keyboard.press("r")
    page.keyboard.type("Left is shorter.")
    page.keyboard.press("Escape")
    page.keyboard.press("Enter")
    banner = page.locator("#flash")
    banner.wait_for(state="visible")
    assert "The server failed (500)" in banner.inner_text()
    assert page.locator("#rationale").input_value() == "Left is shorter."
    assert page.locator("input[name=choice][value=left]").is_checked()
    assert Comparison.objects.count() == 0

    page.unroute(submit_pattern)
    page.keyboard.press("Enter")
    wait_for_next_item(page, first)
    assert banner.is_hidden()
    label = Comparison.objects.get()
    assert label.rationale == "Left is shorter."
    assert label.choice == labelling.canonical_choice("left", labelling.displayed_order(first))


def test_the_compare_page_fits_a_phone(browser_page_for, annotator, project, gridworld_pairs, docs_dir):
    page = browser_page_for(annotator, width=390, height=844)
    open_compare(page, project)
    page.locator("label.choice", has_text="Left").click()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(docs_dir / "compare-phone.png"))


def test_the_home_page_links_the_queue_to_the_compare_page(
    browser_page_for, annotator, project, gridworld_pairs, docs_dir
):
    QueueItem.objects.enqueue_trajectories(project, Trajectory.objects.all())
    rated = Trajectory.objects.first()
    labelling.label_step(annotator, rated, 0, 1)
    labelling.label_step(annotator, rated, 1, -1)
    labelling.rate(annotator, rated, score=2)
    page = browser_page_for(annotator)
    page.goto("/")
    link = page.locator(".queue-link", has_text="comparisons")
    assert "2" in link.inner_text()
    assert "3 step labels" in page.locator(".my-queue").inner_text()
    assert "2 step labels" in page.locator(".labels-today").inner_text()
    assert page.locator(".guidelines h1", has_text="Comparing trajectories").is_visible()
    page.screenshot(path=str(docs_dir / "home.png"))
    link.click()
    page.wait_for_selector("#compare-form")
    assert page.url.endswith(f"/projects/{project.pk}/compare/")
