"""Fixtures for export tests: gridworld trajectories whose every word the tiny policy's tokenizer knows, and
helpers that store labels the way the annotation views do."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.feedback_app.labels import stored_comparison, stored_intervention
from tests.trajectories import save_steps


@pytest.fixture
def third_annotator(django_user_model, project):
    from feedback_app.models import Membership

    user = django_user_model.objects.create_user(username="annotator3", password="pw-annotator3")
    Membership.objects.create(user=user, project=project, role="annotator")
    return user


@pytest.fixture
def grid_task(project):
    from feedback_app.models import Task
    from reward_models.envs.gridworld import INSTRUCTION

    return Task.objects.create(project=project, instruction=INSTRUCTION, seed=11, spec={"seed": 11})


@pytest.fixture
def grid_trajectory(project, grid_task, external_policy):
    """`grid_trajectory(actions, ...)`: a stored trajectory of the real gridworld episode that `actions` play on
    the task (stopping early if the episode ends), with the scripted demonstrator's reasoning."""
    from feedback_app.models import Step, Trajectory
    from reward_models.envs.gridworld import GridWorld
    from reward_models.policy.bootstrap import goal_reasoning

    def make(actions, *, task=None, policy=None, source="import", parent=None, branch_step_index=None):
        task = task or grid_task
        env = GridWorld()
        observation = env.reset(task.spec)
        steps = []
        for action in actions:
            steps.append((observation, goal_reasoning(observation), action))
            result = env.step(action)
            observation = result.observation
            if result.done:
                break
        trajectory = Trajectory.objects.create(
            project=project,
            task=task,
            policy_version=policy if policy is not None else (external_policy if source != "human" else None),
            source=source,
            parent=parent,
            branch_step_index=branch_step_index,
            num_steps=len(steps),
        )
        save_steps(
            trajectory,
            [
                Step(index=i, observation=obs, reasoning=reasoning, action=action)
                for i, (obs, reasoning, action) in enumerate(steps)
            ],
        )
        return trajectory

    return make


@pytest.fixture
def compare(project):
    """`compare(annotator, winner, loser, choice=None, ...)` stores a comparison in canonical order (a.id < b.id)
    whose judgement prefers `winner`; `choice="tie"` or `"both_bad"` stores that instead."""

    def make(annotator, winner, loser, *, choice=None, strength=2, rationale="", assignment=None, seconds=4.0):
        shown = "ab" if winner.pk < loser.pk else "ba"  # the winner on the left
        return stored_comparison(
            project, annotator, winner, loser, choice or "a", seconds=seconds, assignment=assignment,
            strength=strength, rationale=rationale, displayed_order=shown,
        )  # fmt: skip

    return make


@pytest.fixture
def gold_assignment(project):
    """`gold_assignment(annotator, trajectory, other=None)`: an assignment of a gold queue item to `annotator`."""
    from django.utils import timezone

    from feedback_app.models import Assignment, QueueItem

    def make(annotator, trajectory, other=None, kind="comparison"):
        item = QueueItem.objects.create(
            project=project,
            kind=kind,
            trajectory=trajectory,
            other_trajectory=other,
            is_gold=True,
            gold_answer={"choice": "a"},
        )
        return Assignment.objects.create(
            item=item, annotator=annotator, slot=0, leased_until=timezone.now() + timedelta(minutes=30)
        )

    return make


@pytest.fixture
def policy_tokenizer(tiny_policy_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_policy_dir)


@pytest.fixture
def labelled_project(project, annotator, other_annotator, grid_trajectory, compare):
    """A project with at least one row of every export kind, from two annotators."""
    from feedback_app.models import Critique, Rating, StepLabel

    good = grid_trajectory(["right", "right", "down", "down"])
    bad = grid_trajectory(["up", "left", "down", "up"])
    other = grid_trajectory(["down", "right", "right"])
    child = grid_trajectory(["up", "right", "right", "down"], parent=bad, branch_step_index=1)
    grid_trajectory(["right", "right", "right", "down", "down"], source="human")
    for user in (annotator, other_annotator):
        compare(user, good, bad, strength=3, rationale="heads for the goal")
        compare(user, other, bad)
    compare(annotator, child, bad)
    compare(annotator, good, other, choice="tie")
    for trajectory, values in ((good, [1, 1, 1, 1]), (bad, [-1, 0, -1, 1])):
        for step, value in zip(trajectory.steps.order_by("index"), values, strict=True):
            StepLabel.objects.create(project=project, annotator=annotator, step=step, value=value)
    Rating.objects.create(project=project, annotator=annotator, trajectory=good, thumb_up=True)
    Rating.objects.create(project=project, annotator=annotator, trajectory=bad, thumb_up=False)
    Rating.objects.create(project=project, annotator=other_annotator, trajectory=other, score=4)
    Rating.objects.create(project=project, annotator=other_annotator, trajectory=child, score=1)
    step = bad.steps.get(index=1)
    stored_intervention(annotator, step, "right", step.reasoning, reason="left bumps the edge", child_trajectory=child)
    Critique.objects.create(project=project, annotator=annotator, trajectory=bad, step=step, text="a wasted move")
    return project
