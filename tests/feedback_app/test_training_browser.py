"""From labels to a new policy's rollouts in the annotators' queue without a shell: in real Chromium a researcher
freezes demonstrations into a snapshot and fine-tunes the policy on them; a real Celery worker trains, registers the
new version and plays it on the review tasks; the annotator's compare page then serves it against its parent."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from feedback_app.models import PolicyVersion, QueueItem, RunStatus, TrainingRun
from feedback_app.queue import REVIEW_STRATEGY

pytestmark = [pytest.mark.browser, pytest.mark.worker]

QUICK = '{"max_steps": 6, "batch_size": 8, "eval_tasks": 8}'


def test_a_researcher_fine_tunes_the_policy_from_the_page_and_its_rollouts_reach_the_annotators(
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

    page.select_option("#snapshot-kind", "sft")
    page.fill("#snapshot-name", "demonstrations")
    page.click("#snapshot-form button[type=submit]")
    page.wait_for_selector("text=6 sft rows frozen")

    page.select_option("#policy-kind", "sft")
    page.select_option("#policy-snapshot", label="demonstrations (sft)")
    page.fill("#policy-settings", QUICK)
    page.fill("#policy-name", "tiny-sft")
    page.fill("#policy-review-tasks", "3")
    page.click("#policy-form button[type=submit]")
    page.wait_for_selector("text=SFT run")

    run = TrainingRun.objects.get(kind="sft")
    # The runs table polls: the run and then its review rollout finish without a reload.
    page.wait_for_selector(f"#run-{run.pk} .status-succeeded, #run-{run.pk} .status-failed", timeout=300_000)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, f"{run.error}\n{worker.log_path.read_text()}"
    review = TrainingRun.objects.get(pk=run.summary["review_run"])
    page.wait_for_selector(f"#run-{review.pk} .status-succeeded, #run-{review.pk} .status-failed", timeout=300_000)
    review.refresh_from_db()
    assert review.status == RunStatus.SUCCEEDED, f"{review.error}\n{worker.log_path.read_text()}"

    version = PolicyVersion.objects.get(name="tiny-sft")
    assert version.parent == tiny_policy and version.produced_by == run
    items = QueueItem.objects.filter(query_strategy=REVIEW_STRATEGY)
    assert items.count() == 3 and all(item.priority == 10 for item in items)
    page.reload()
    row = page.inner_text(f"#policy-{version.pk}")
    assert re.search(r"\d\.\d{3} ± \d\.\d{3} / \d\.\d{3} ± \d\.\d{3} \(8 tasks\)", row), row
    assert "awaiting labels" in row
    page.screenshot(path=str(docs_dir / "training.png"), full_page=True)

    # The annotator's next comparison is the new version against its parent, blind.
    annotator_page = browser_page_for(annotator)
    annotator_page.goto(reverse("compare-next", args=[project.pk]))
    annotator_page.wait_for_selector(".compare-grid")
    shown = set(re.findall(r"/compare/(\d+)/", annotator_page.content()))
    assert shown, "the compare page serves an item"
    assert "tiny-sft" not in annotator_page.content()
    leased = QueueItem.objects.filter(assignments__annotator=annotator).get()
    assert leased.query_strategy == REVIEW_STRATEGY
