"""A new policy version served back: its review rollout queues blind comparisons against its parent on the same
tasks (rolling the parent out where it never played them) and records both versions' reward-model scores."""

from __future__ import annotations

import pytest

from feedback_app.models import (
    Evaluation,
    PolicyVersion,
    QueueItem,
    RegisteredModel,
    RunStatus,
    TrainingRun,
    Trajectory,
)
from feedback_app.models.projects import QueryStrategy
from training.rollouts import RolloutConfig, create_rollout_run, run_rollout
from training.runs import execute_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def child_policy(project, tiny_policy):
    return PolicyVersion.objects.create(
        project=project, name="tiny+dpo", kind="local", weights_path=tiny_policy.weights_path, parent=tiny_policy
    )


def review_run(project, policy, **config) -> TrainingRun:
    settings = {"num_tasks": 3, "samples_per_task": 2, "compare_with_parent": True, "review_priority": 7, **config}
    run = create_rollout_run(project, policy, RolloutConfig(**settings))
    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    return run


def test_a_review_rollout_plays_the_parent_where_needed_and_queues_each_new_trajectory_against_it(
    project, tiny_policy, child_policy, review_tasks
):
    run = review_run(project, child_policy)

    new = Trajectory.objects.filter(rollout_run=run, policy_version=child_policy)
    parent = Trajectory.objects.filter(rollout_run=run, policy_version=tiny_policy)
    assert new.count() == 6 and parent.count() == 6  # the parent had never played the review tasks
    assert run.summary["trajectories"] == 6  # the summary is the new version's
    items = QueueItem.objects.filter(project=project, query_strategy=QueryStrategy.NEW_VS_PARENT)
    assert items.count() == run.summary["review"]["comparisons"] == 6
    for item in items.select_related("trajectory", "other_trajectory"):
        versions = {item.trajectory.policy_version_id, item.other_trajectory.policy_version_id}
        assert versions == {child_policy.pk, tiny_policy.pk}
        assert item.trajectory.task_id == item.other_trajectory.task_id
        assert item.priority == 7 and item.kind == "comparison"
    assert {item.trajectory_id for item in items} | {item.other_trajectory_id for item in items} >= set(
        new.values_list("id", flat=True)
    )


def test_a_review_rollout_reuses_the_parents_trajectories_and_repeating_it_queues_nothing_twice(
    project, tiny_policy, child_policy, review_tasks
):
    earlier = create_rollout_run(project, tiny_policy, RolloutConfig(num_tasks=3, samples_per_task=1))
    execute_run(earlier.pk, run_rollout)

    run = review_run(project, child_policy)
    assert not Trajectory.objects.filter(rollout_run=run, policy_version=tiny_policy).exists()
    assert QueueItem.objects.filter(query_strategy=QueryStrategy.NEW_VS_PARENT).count() == 6

    # A worker that died after queueing but before marking the run done: taken up again, nothing doubles.
    TrainingRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED
    assert QueueItem.objects.filter(query_strategy=QueryStrategy.NEW_VS_PARENT).count() == 6
    assert Trajectory.objects.filter(rollout_run=run).count() == 6


def test_a_version_without_a_parent_has_nothing_to_be_compared_with(project, tiny_policy, review_tasks):
    run = review_run(project, tiny_policy)
    assert run.summary["review"] == {"comparisons": 0}
    assert "no parent version" in run.log
    assert not QueueItem.objects.filter(query_strategy=QueryStrategy.NEW_VS_PARENT).exists()


def test_the_projects_reward_model_scores_both_versions_review_trajectories(
    project, tiny_policy, child_policy, review_tasks, tiny_base_model, tmp_path
):
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.model import load_reward_model
    from reward_models.reward.train import main as train_reward_model
    from simulation.episodes import scripted_episodes
    from simulation.oracle_data import preference_rows, write_jsonl

    data = write_jsonl(preference_rows(scripted_episodes(6, per_task=3, seed=3)), tmp_path / "pairs.jsonl")
    config = RewardConfig(
        data_path=str(data), base_model=str(tiny_base_model), output_dir=str(tmp_path / "rm"), max_steps=4
    )
    train_reward_model(config)
    rm_run = TrainingRun.objects.create(project=project, kind="reward_model", status=RunStatus.SUCCEEDED)
    RegisteredModel.objects.create(
        project=project, name="rm", kind="reward_model", path=config.output_dir, run=rm_run, base_model="tiny"
    )

    run = review_run(project, child_policy)

    scores = {e.policy_version_id: e for e in Evaluation.objects.filter(run=run, name="rm_score")}
    assert set(scores) == {child_policy.pk, tiny_policy.pk}
    assert scores[child_policy.pk].n == 6 and scores[tiny_policy.pk].n == 6
    from feedback_app.exports.conversation import fetch_conversations

    trajectories = list(Trajectory.objects.filter(rollout_run=run, policy_version=child_policy))
    messages = [c.messages for c in fetch_conversations([t.pk for t in trajectories]).values()]
    rewards, _ = load_reward_model(config.output_dir).score([m[:2] for m in messages], [m[2:] for m in messages])
    assert scores[child_policy.pk].value == pytest.approx(sum(rewards) / len(rewards), abs=1e-5)
    assert run.summary["review"]["rm_score_new"] == pytest.approx(scores[child_policy.pk].value)
