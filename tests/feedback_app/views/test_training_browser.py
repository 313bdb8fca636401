"""From labels to a new policy's rollouts in the annotators' queue without a shell: in real Chromium a researcher
launches SFT from its form (freezing the demonstrations into a snapshot in the same form), a real Celery worker
trains, registers the new version and plays it on the review tasks, and the annotator's compare page serves it
against its parent. Then a long PPO run launched from its form shows its progress bar move and is cancelled from
its page; the pages fit a phone's width."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from feedback_app.models import DatasetSnapshot, PolicyVersion, QueueItem, RunStatus, TrainingRun
from feedback_app.models.projects import QueryStrategy

pytestmark = [pytest.mark.browser, pytest.mark.worker]

PHONE = {"width": 390, "height": 844}
RUN_PAGE = re.compile(r"/training/runs/\d+/$")
# The elements that stick out past a phone's screen, for the failure message.
WIDE = """[...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).slice(0, 8)
    .map(e => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}px`)"""
FITS_WIDTH = "document.documentElement.scrollWidth <= window.innerWidth"


def fill_settings(page, values: dict[str, str]) -> None:
    """Fill launch-form settings by name, opening the shared settings first (they start folded)."""
    page.click("#launch-form .shared-settings > summary")
    for name, value in values.items():
        page.fill(f'#launch-form [name="config.{name}"]', value)


def test_a_researcher_launches_watches_and_cancels_runs_from_the_dashboard(
    celery_workers,
    settings,
    tmp_path,
    browser_page_for,
    researcher,
    annotator,
    project,
    tiny_policy,
    demonstrations,
    review_tasks,
    docs_dir,
):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    worker = celery_workers(extra_env={"ARTIFACT_ROOT": str(settings.ARTIFACT_ROOT)})
    page = browser_page_for(researcher)
    page.goto(reverse("training", args=[project.pk]))

    # The kind selector swaps in SFT's form; with no sft snapshot yet it offers to make one from filters.
    page.select_option("#launch-kind", "sft")
    page.wait_for_selector('#launch-form input[name="kind"][value="sft"]', state="attached")
    assert page.input_value("#launch-snapshot") == "new"
    page.select_option("#launch-base-policy", str(tiny_policy.pk))
    page.fill("#launch-new-snapshot-name", "demonstrations")
    fill_settings(page, {"max_steps": "6", "batch_size": "8", "eval_tasks": "8"})
    page.fill("#launch-config-name", "tiny-sft")
    page.fill("#launch-review-num-tasks", "3")
    page.click("#launch-form button[type=submit]")
    page.wait_for_url(RUN_PAGE)

    run = TrainingRun.objects.get(kind="sft")
    assert DatasetSnapshot.objects.get(name="demonstrations").row_count == 6 and run.snapshot.name == "demonstrations"
    assert page.url.endswith(reverse("training-run", args=[project.pk, run.pk]))
    # The run page polls until the run is done.
    page.wait_for_selector("#run .status-succeeded, #run .status-failed", timeout=300_000)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, f"{run.error}\n{worker.log_path.read_text()}"
    assert page.inner_text("#run .run-progress").startswith("done")
    review = TrainingRun.objects.get(pk=run.summary["review_run"])
    page.goto(reverse("training", args=[project.pk]))
    page.wait_for_selector(f"#run-{review.pk} .status-succeeded, #run-{review.pk} .status-failed", timeout=300_000)
    review.refresh_from_db()
    assert review.status == RunStatus.SUCCEEDED, f"{review.error}\n{worker.log_path.read_text()}"

    version = PolicyVersion.objects.get(name="tiny-sft")
    assert version.parent == tiny_policy and version.produced_by == run
    items = QueueItem.objects.filter(query_strategy=QueryStrategy.NEW_VS_PARENT)
    assert items.count() == 3 and all(item.priority == 10 for item in items)
    page.reload()
    row = page.inner_text(f"#policy-{version.pk}")
    assert re.search(r"\d\.\d{3} ± \d\.\d{3} / \d\.\d{3} ± \d\.\d{3} \(8 tasks\)", row), row
    assert "awaiting labels" in row

    # A long PPO run on the environment's own reward: its bar moves, then it is cancelled from its page.
    page.select_option("#launch-kind", "ppo")
    page.wait_for_selector('#launch-form input[name="kind"][value="ppo"]', state="attached")
    page.select_option("#launch-base-policy", str(tiny_policy.pk))
    page.select_option("#launch-config-reward-source", "oracle")
    page.fill("#launch-config-rollouts-per-step", "4")
    page.fill("#launch-config-max-turns", "4")
    page.fill("#launch-config-selection-tasks", "0")
    fill_settings(page, {"max_steps": "400", "batch_size": "8", "eval_tasks": "0", "save_steps": "400"})
    # By keyboard: the runs table above polls and can move the box between a mouse click's aim and its landing.
    page.focus("#launch-review-enabled")
    page.keyboard.press("Space")
    assert not page.is_checked("#launch-review-enabled")
    page.click("#launch-form button[type=submit]")
    page.wait_for_url(RUN_PAGE)
    ppo = TrainingRun.objects.get(kind="ppo")
    assert ppo.config["reward_source"] == "oracle" and ppo.config["max_steps"] == 400
    moved = "value => Number(document.querySelector('#run-progress').getAttribute('value')) > value"
    page.wait_for_function(moved, arg=0, timeout=180_000)
    first = int(page.get_attribute("#run-progress", "value"))
    page.wait_for_function(moved, arg=first, timeout=60_000)
    assert "ETA" in page.inner_text("#run .run-progress")
    page.screenshot(path=str(docs_dir / "run.png"), full_page=True)
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.click("#run .run-actions button:has-text('Cancel')")
    page.wait_for_selector("#run .status-cancelled", timeout=60_000)
    assert asked and asked[0].startswith(f"Cancel run {ppo.pk}?")  # asked first
    ppo.refresh_from_db()
    assert ppo.status == RunStatus.CANCELLED and 0 < ppo.progress_current < 400
    assert page.is_visible("#run .run-actions button:has-text('Re-run')")
    page.goto(reverse("training", args=[project.pk]))
    page.screenshot(path=str(docs_dir / "training.png"), full_page=True)

    phone = browser_page_for(researcher, **PHONE)
    for path in (reverse("training", args=[project.pk]), reverse("training-run", args=[project.pk, ppo.pk])):
        phone.goto(path)
        assert phone.evaluate(FITS_WIDTH), f"{path} is wider than a phone: {phone.evaluate(WIDE)}"

    # The annotator's next comparison is the new version against its parent, blind.
    annotator_page = browser_page_for(annotator)
    annotator_page.goto(reverse("compare-next", args=[project.pk]))
    annotator_page.wait_for_selector(".compare-grid")
    shown = set(re.findall(r"/compare/(\d+)/", annotator_page.content()))
    assert shown, "the compare page serves an item"
    assert "tiny-sft" not in annotator_page.content()
    leased = QueueItem.objects.filter(assignments__annotator=annotator).get()
    assert leased.query_strategy == QueryStrategy.NEW_VS_PARENT
