"""The demo bootstrap behind ./run.sh: everything a first start needs, and a second start trains nothing again."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command

from feedback_app.models import (
    Evaluation,
    Membership,
    PolicyVersion,
    Project,
    QueueItem,
    Task,
    TrainingRun,
    Trajectory,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _bootstrap() -> str:
    out = io.StringIO()
    call_command(
        "bootstrap_demo", "--quick", "--review-tasks", "3", "--train-tasks", "4", "--samples", "2", stdout=out
    )
    return out.getvalue()


def test_bootstrap_demo_builds_the_demo_once_and_is_safe_to_repeat(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"

    first = _bootstrap()

    project = Project.objects.get(slug="gridworld-demo")
    assert Task.objects.filter(project=project, split="review").count() == 3
    assert Task.objects.filter(project=project, split="eval").count() == 200
    assert set(Membership.objects.filter(project=project).values_list("user__username", "role")) == {
        ("annotator", "annotator"),
        ("researcher", "researcher"),
        ("admin", "admin"),
    }
    policy = PolicyVersion.objects.get(project=project, name="tiny-base")
    assert (tmp_path / "artifacts" / "policies").exists() and policy.produced_by.kind == "bootstrap"
    assert set(Evaluation.objects.filter(policy_version=policy).values_list("decoding", flat=True)) == {
        "greedy",
        "sampled",
    }
    assert Trajectory.objects.filter(project=project, policy_version=policy).count() == 6
    # 3 tasks × 2 samples: one comparison per task, and every trajectory for step labels.
    assert QueueItem.objects.filter(project=project, kind="comparison").count() == 3
    assert QueueItem.objects.filter(project=project, kind="step_label").count() == 6
    logins = dict(line.split() for line in (tmp_path / "demo-logins.txt").read_text().splitlines())
    assert set(logins) == {"annotator", "researcher", "admin"}
    assert f"annotator   {logins['annotator']}" in first

    # The tool-use demo: the shipped tool-calling policy, copied and evaluated, and its chat trajectories queued.
    shop = Project.objects.get(slug="tool-use-demo")
    assert shop.environment.dotted_path == "reward_models.envs.toolshop.ToolShop"
    tool_policy = PolicyVersion.objects.get(project=shop, name="tiny-base")
    assert tool_policy.produced_by.summary["shipped"] is True
    assert (Path(tool_policy.weights_path) / "model.safetensors").is_file()
    assert Evaluation.objects.filter(policy_version=tool_policy, n=4).count() == 2
    chats = Trajectory.objects.filter(project=shop, policy_version=tool_policy)
    assert chats.count() == 6 and all(t.tools for t in chats)
    assert QueueItem.objects.filter(project=shop).count() == 9
    assert "Tool-use demo" in first

    second = _bootstrap()

    assert TrainingRun.objects.count() == 4, "a second start neither trains nor rolls out again"
    assert Trajectory.objects.count() == 12 and Task.objects.count() == 2 * 207
    assert QueueItem.objects.count() == 18, "nothing is queued twice"
    assert "Gridworld demo: base policy kept" in second and "Tool-use demo: base policy kept" in second
    assert f"annotator   {logins['annotator']}" in second, "the same passwords are printed again"


def test_the_bootstrap_trains_with_the_worker_thread_setting_unless_the_run_names_its_own(settings, project):
    from training.bootstrap import bootstrap_config

    settings.TANDEM_TORCH_THREADS = 3
    assert bootstrap_config(TrainingRun(project=project, config={})).num_threads == 3
    assert bootstrap_config(TrainingRun(project=project, config={"num_threads": 2})).num_threads == 2
    settings.TANDEM_TORCH_THREADS = 0  # unset: the bootstrap's own default
    assert bootstrap_config(TrainingRun(project=project, config={})).num_threads == 2
