from __future__ import annotations

import pytest

from feedback_app.models import RunStatus, Step, TrainingRun, Trajectory
from training.rollouts import RolloutConfig, create_rollout_run, run_rollout
from training.runs import execute_run

pytestmark = pytest.mark.django_db


def test_a_rollout_run_stores_every_episode_with_its_steps(project, tiny_policy, review_tasks):
    run = create_rollout_run(project, tiny_policy, RolloutConfig(num_tasks=3, samples_per_task=2, seed=1))

    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED

    run.refresh_from_db()
    trajectories = Trajectory.objects.filter(rollout_run=run)
    assert trajectories.count() == 6
    assert sorted(trajectories.values_list("task_id", "sample_index")) == sorted(
        (task.pk, k) for task in review_tasks for k in range(2)
    )
    assert (run.progress_current, run.progress_total, run.summary["trajectories"]) == (6, 6, 6)
    assert run.started_at and run.finished_at and run.attempts == 1
    first = trajectories.order_by("id").first()
    steps = list(first.steps.order_by("index"))
    assert len(steps) == first.num_steps > 0
    assert steps[0].render["rows"], "the gridworld render is kept for the UI"
    assert first.oracle["step_correct"] and len(first.oracle["step_correct"]) == first.num_steps
    assert first.source == "policy" and first.policy_version == tiny_policy


def test_a_rollout_run_is_idempotent(project, tiny_policy, review_tasks):
    run = create_rollout_run(project, tiny_policy, RolloutConfig(num_tasks=2, samples_per_task=1))
    execute_run(run.pk, run_rollout)
    steps_before = Step.objects.count()

    # A redelivered message finds the run finished and does nothing.
    assert execute_run(run.pk, run_rollout) is None
    # A worker that died after storing but before marking the run done is taken up again without duplicates.
    TrainingRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED
    assert Trajectory.objects.filter(rollout_run=run).count() == 2
    assert Step.objects.count() == steps_before


def test_the_same_seed_gives_the_same_rollouts(project, tiny_policy, review_tasks):
    actions = []
    for _ in range(2):
        run = create_rollout_run(project, tiny_policy, RolloutConfig(num_tasks=2, samples_per_task=2, seed=5))
        execute_run(run.pk, run_rollout)
        actions.append(
            list(
                Step.objects.filter(trajectory__rollout_run=run)
                .order_by("trajectory_id", "index")
                .values_list("action", flat=True)
            )
        )
    assert actions[0] == actions[1]


def test_a_bad_config_fails_the_run_and_keeps_the_reason(project, tiny_policy, review_tasks):
    run = TrainingRun.objects.create(
        project=project, kind="rollout", base_policy=tiny_policy, config={"samples_per_task": 0}
    )
    assert execute_run(run.pk, run_rollout) == RunStatus.FAILED
    run.refresh_from_db()
    assert "samples_per_task must be at least 1, got 0" in run.error
    assert Trajectory.objects.filter(rollout_run=run).count() == 0


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="temperature must be positive"):
        RolloutConfig(temperature=0)
    with pytest.raises(ValueError, match="split must be one of"):
        RolloutConfig(split="everything")
    with pytest.raises(ValueError, match=r"unknown rollout settings: \['sampels'\]"):
        RolloutConfig.from_dict({"sampels": 3})


def test_an_external_policy_cannot_be_rolled_out(project, external_policy):
    with pytest.raises(ValueError, match="is external"):
        create_rollout_run(project, external_policy, RolloutConfig())
