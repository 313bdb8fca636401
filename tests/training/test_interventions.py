"""Continuing an intervention: the child trajectory replays the corrected prefix, then the policy plays on."""

from __future__ import annotations

import socket
import time

import pytest

from feedback_app.models import Intervention, PolicyVersion, Step, Task, Trajectory
from reward_models.envs.gridworld import ACTIONS, GridWorld
from tests.feedback_app.labels import stored_intervention
from tests.trajectories import save_steps
from training import tasks
from training.interventions import continue_intervention, continuing_policy

pytestmark = pytest.mark.django_db


@pytest.fixture
def oracle(task):
    return GridWorld().oracle(task.spec)


def _wander(oracle, n_steps: int) -> list[str]:
    """Actions that never bring the agent closer to the goal, so the episode cannot end early."""
    actions: list[str] = []
    for _ in range(n_steps):
        actions.append(next(a for a in ACTIONS if a not in oracle.best_actions(actions)))
    return actions


def _optimal(oracle, prefix: list[str]) -> list[str]:
    actions = list(prefix)
    while best := oracle.best_actions(actions):
        actions.append(best[0])
    return actions[len(prefix) :]


@pytest.fixture
def make_rollout(project, task):
    def make(actions: list[str], policy_version) -> Trajectory:
        trajectory = Trajectory.objects.create(
            project=project, task=task, policy_version=policy_version, source="policy", num_steps=len(actions)
        )
        save_steps(
            trajectory,
            [Step(index=i, reasoning=f"thought {i}", action=a, logprob=-1.0 - i) for i, a in enumerate(actions)],
        )
        return trajectory

    return make


def _intervene(annotator, trajectory, step_index, corrected, takeover=(), reasoning="") -> Intervention:
    step = trajectory.steps.get(index=step_index)
    return stored_intervention(
        annotator, step, corrected, reasoning, takeover_actions=list(takeover), reason="walked away from the goal"
    )


def test_the_child_replays_the_corrected_prefix_and_the_policy_plays_on(annotator, oracle, make_rollout, tiny_policy):
    original_actions = _wander(oracle, 3)
    trajectory = make_rollout(original_actions, tiny_policy)
    corrected = oracle.best_actions(original_actions[:1])[0]
    takeover = oracle.best_actions([original_actions[0], corrected])[0]
    intervention = _intervene(annotator, trajectory, 1, corrected, [takeover], reasoning="the goal is below")

    child_id = continue_intervention(intervention.pk)

    intervention.refresh_from_db()
    assert intervention.status == "done" and intervention.error == ""
    child = Trajectory.objects.get(pk=child_id)
    assert intervention.child_trajectory == child
    assert (child.parent, child.branch_step_index, child.task_id) == (trajectory, 1, trajectory.task_id)
    assert child.source == "policy" and child.policy_version == tiny_policy
    assert child.metadata["intervention"] == intervention.pk and child.metadata["human_steps"] == [1, 2]
    steps = list(child.steps.order_by("index"))
    assert [s.action for s in steps[:3]] == [original_actions[0], corrected, takeover]
    assert (steps[0].reasoning, steps[0].logprob) == ("thought 0", -1.0)  # the parent's own first step
    assert steps[1].reasoning == "the goal is below"
    assert len(steps) == child.num_steps > 3  # the policy took at least one turn after the takeover
    assert steps[0].render["kind"] == "grid"
    # Outcome fields as a rollout stores them: the oracle's verdict on the child's actions.
    actions = [s.action for s in steps]
    assert child.oracle["step_correct"] == oracle.step_correct(actions)
    assert child.outcome_return == oracle.true_return(actions) and child.success == oracle.success(actions)


def test_a_second_delivery_does_nothing_and_a_stored_child_is_reused(annotator, oracle, make_rollout, tiny_policy):
    trajectory = make_rollout(_wander(oracle, 2), tiny_policy)
    intervention = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])
    child_id = continue_intervention(intervention.pk)
    trajectories, steps = Trajectory.objects.count(), Step.objects.count()

    assert continue_intervention(intervention.pk) == child_id
    # A worker that stored the child but died before marking the row done: the next attempt adopts that child.
    Intervention.objects.filter(pk=intervention.pk).update(status="running", child_trajectory=None)
    assert continue_intervention(intervention.pk) == child_id
    intervention.refresh_from_db()
    assert intervention.status == "done" and intervention.child_trajectory_id == child_id
    assert (Trajectory.objects.count(), Step.objects.count()) == (trajectories, steps)


def test_an_illegal_takeover_action_fails_with_a_clear_error(annotator, oracle, make_rollout, tiny_policy):
    original_actions = _wander(oracle, 3)
    trajectory = make_rollout(original_actions, tiny_policy)
    corrected = oracle.best_actions(original_actions[:1])[0]
    intervention = _intervene(annotator, trajectory, 1, corrected, ["down", "jump"])

    assert continue_intervention(intervention.pk) is None

    intervention.refresh_from_db()
    assert intervention.status == "failed" and intervention.child_trajectory is None
    assert intervention.error == "takeover_actions: step 4: 'jump' is not a legal action; legal: up, down, left, right"
    assert not Trajectory.objects.filter(parent=trajectory).exists()


def test_a_task_without_seed_or_spec_fails_the_continuation_and_says_so(annotator, oracle, make_rollout, tiny_policy):
    trajectory = make_rollout(_wander(oracle, 2), tiny_policy)
    intervention = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])
    Task.objects.filter(pk=trajectory.task_id).update(seed=None, spec={})  # as an import without either stores it

    assert continue_intervention(intervention.pk) is None

    intervention.refresh_from_db()
    assert intervention.status == "failed" and intervention.child_trajectory is None
    assert intervention.error.startswith("trajectory: This trajectory was imported without its task's seed or spec")


def test_without_a_runnable_policy_it_fails_and_says_why(annotator, oracle, make_rollout, external_policy):
    trajectory = make_rollout(_wander(oracle, 2), external_policy)
    intervention = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])

    assert continue_intervention(intervention.pk) is None

    intervention.refresh_from_db()
    assert intervention.status == "failed"
    assert "No policy can continue this trajectory" in intervention.error
    assert "agent-v1" in intervention.error and "no local or endpoint policy version" in intervention.error


def test_an_external_trajectory_is_continued_by_the_newest_runnable_policy(
    annotator, project, oracle, make_rollout, external_policy, tiny_policy_dir
):
    older = PolicyVersion.objects.create(project=project, name="old", kind="local", weights_path=str(tiny_policy_dir))
    newer = PolicyVersion.objects.create(project=project, name="new", kind="local", weights_path=str(tiny_policy_dir))
    trajectory = make_rollout(_wander(oracle, 2), external_policy)
    assert continuing_policy(trajectory) == newer != older
    assert continuing_policy(make_rollout(_wander(oracle, 2), older)) == older

    intervention = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])
    child = Trajectory.objects.get(pk=continue_intervention(intervention.pk))
    assert child.policy_version == newer and child.source == "policy"


def test_a_takeover_that_ends_the_episode_is_a_human_trajectory_and_needs_no_policy(
    annotator, oracle, make_rollout, external_policy
):
    trajectory = make_rollout(_wander(oracle, 2), external_policy)
    path = _optimal(oracle, [])
    intervention = _intervene(annotator, trajectory, 0, path[0], path[1:])

    child = Trajectory.objects.get(pk=continue_intervention(intervention.pk))

    assert child.source == "human" and child.policy_version is None
    assert list(child.steps.order_by("index").values_list("action", flat=True)) == path
    assert child.success and child.metadata["human_steps"] == list(range(len(path)))


def test_an_unreachable_endpoint_fails_the_row_and_is_raised_for_a_retry(
    annotator, project, oracle, make_rollout, settings
):
    settings.TANDEM_ENDPOINT_ALLOWLIST = ["127.0.0.1"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = PolicyVersion.objects.create(
        project=project, name="served", kind="endpoint", endpoint_url=f"http://127.0.0.1:{port}/v1", endpoint_model="x"
    )
    trajectory = make_rollout(_wander(oracle, 2), endpoint)
    intervention = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])

    with pytest.raises(ConnectionError):
        continue_intervention(intervention.pk)

    intervention.refresh_from_db()
    assert intervention.status == "failed" and "EndpointUnavailable" in intervention.error


def test_a_superseded_revision_is_not_continued(annotator, oracle, make_rollout, tiny_policy):
    trajectory = make_rollout(_wander(oracle, 2), tiny_policy)
    first = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])
    second = first.revise(reason="on second thought")
    assert second.original_action == first.original_action and second.status == "pending"

    assert continue_intervention(first.pk) is None
    first.refresh_from_db()
    assert first.status == "failed" and "Superseded" in first.error
    assert not Trajectory.objects.filter(parent=trajectory).exists()


def test_a_missing_intervention_is_dropped(db):
    assert continue_intervention(987654) is None


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_continuation_enqueued_on_the_broker_is_finished_by_a_worker(
    celery_worker_process, annotator, oracle, make_rollout, tiny_policy
):
    trajectory = make_rollout(_wander(oracle, 2), tiny_policy)
    intervention = _intervene(annotator, trajectory, 0, oracle.best_actions([])[0])

    tasks.continue_intervention.delay(intervention.pk)

    deadline = time.monotonic() + 180
    while intervention.status in ("pending", "running") and time.monotonic() < deadline:
        time.sleep(0.5)
        intervention.refresh_from_db()
    log = celery_worker_process.log_path.read_text()
    assert intervention.status == "done", f"{intervention.status}: {intervention.error}\n--- worker log ---\n{log}"
    assert intervention.child_trajectory.parent_id == trajectory.pk
    assert "training.continue_intervention" in log
