"""The human win rate of a version against its parent, from the annotators' current verdicts, with its Wilson
interval."""

from __future__ import annotations

import math

import pytest

from feedback_app.models import Comparison, PolicyVersion, Trajectory
from feedback_app.win_rates import human_win_rate, wilson_interval

pytestmark = pytest.mark.django_db


@pytest.fixture
def child_policy(project, tiny_policy):
    return PolicyVersion.objects.create(
        project=project, name="tiny+dpo", kind="local", weights_path=tiny_policy.weights_path, parent=tiny_policy
    )


def test_the_human_win_rate_counts_current_verdicts_with_ties_as_half(
    project, annotator, other_annotator, tiny_policy, child_policy, task
):
    def trajectory(policy):
        return Trajectory.objects.create(project=project, task=task, policy_version=policy, num_steps=1)

    def compare(new_wins: str, annotator=annotator):
        new, old = trajectory(child_policy), trajectory(tiny_policy)
        a, b = sorted((new, old), key=lambda t: t.pk)
        choice = {"new": "a" if a == new else "b", "old": "b" if a == new else "a"}.get(new_wins, new_wins)
        return Comparison.objects.create(
            project=project, annotator=annotator, trajectory_a=a, trajectory_b=b, choice=choice
        )

    assert human_win_rate(tiny_policy) is None  # no parent
    assert human_win_rate(child_policy)["value"] is None
    for verdict in ("new", "new", "new", "old", "tie", "both_bad"):
        compare(verdict)
    superseded = compare("old", annotator=other_annotator)
    Comparison.objects.filter(pk=superseded.pk).update(is_current=False)
    # Two trajectories of the same version are not a verdict between versions.
    Comparison.objects.create(
        project=project,
        annotator=annotator,
        trajectory_a=trajectory(child_policy),
        trajectory_b=trajectory(child_policy),
        choice="a",
    )

    result = human_win_rate(child_policy)
    assert (result["wins"], result["losses"], result["ties"], result["n"]) == (3, 1, 2, 6)
    assert result["value"] == pytest.approx(4 / 6)
    assert result["low"] < result["value"] < result["high"]
    assert (result["low"], result["high"]) == pytest.approx(wilson_interval(4 / 6, 6))


def test_the_wilson_interval_matches_a_worked_example():
    # 8 successes out of 10: the textbook Wilson 95 % interval is (0.490, 0.943).
    low, high = wilson_interval(0.8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert wilson_interval(0.0, 5)[0] == 0.0 and wilson_interval(1.0, 5)[1] == 1.0
    assert not math.isnan(wilson_interval(0.5, 1)[0])
