from __future__ import annotations

import pytest

from feedback_app.models import StepLabel
from reward_models.policy.turns import transcript
from tests.feedback_app.exports.helpers import decision, prompt_until, rows, steps_of, turns_from

ACTIONS = ["right", "up", "down", "left"]


@pytest.fixture
def label_steps(project):
    def label(annotator, trajectory, values: dict[int, int]) -> list[StepLabel]:
        steps = steps_of(trajectory)
        return [
            StepLabel.objects.create(project=project, annotator=annotator, step=steps[index], value=value)
            for index, value in values.items()
        ]

    return label


def expected_transcript(trajectory, last_step: int) -> str:
    return transcript(prompt_until(trajectory, 0) + turns_from(trajectory, 0)[: 1 + 2 * last_step])


def test_each_labelled_step_is_one_completion_ending_at_its_decision(project, annotator, grid_trajectory, label_steps):
    trajectory = grid_trajectory(ACTIONS)
    labels = label_steps(annotator, trajectory, {0: 1, 1: -1, 2: 1})

    [row] = rows(project, "stepwise", style="text")

    steps = steps_of(trajectory)
    assert row["labels"] == [True, False, True]
    assert row["step_indices"] == [0, 1, 2]
    assert row["prompt"] == "System: reach the goal G\nUser: " + steps[0].observation + "\nAssistant:"
    for completion, step in zip(row["completions"], steps, strict=False):
        assert completion.endswith(decision(step)["content"])
    assert row["completions"][1].startswith("\nUser: " + steps[1].observation + "\nAssistant: ")
    # The unlabelled last step is cut: nothing after the last label is there to learn from.
    assert row["prompt"] + "".join(row["completions"]) == expected_transcript(trajectory, 2)
    assert row["label_ids"] == sorted(label.pk for label in labels)
    assert (row["trajectory_id"], row["annotator_ids"], row["agreement"]) == (trajectory.pk, [annotator.pk], 1.0)


@pytest.mark.parametrize(
    ("neutral", "labels", "step_indices"),
    [
        ("drop", [True, False], [0, 2]),
        ("positive", [True, True, False], [0, 1, 2]),
        ("negative", [True, False, False], [0, 1, 2]),
    ],
)
def test_neutral_labels_are_dropped_or_mapped_as_asked(
    project, annotator, grid_trajectory, label_steps, neutral, labels, step_indices
):
    trajectory = grid_trajectory(ACTIONS)
    label_steps(annotator, trajectory, {0: 1, 1: 0, 2: -1})

    [row] = rows(project, "stepwise", style="text", neutral=neutral)

    assert (row["labels"], row["step_indices"]) == (labels, step_indices)
    # A dropped step stays in the text as context of the next labelled one.
    assert row["prompt"] + "".join(row["completions"]) == expected_transcript(trajectory, 2)


def test_a_trajectory_with_only_neutral_labels_gives_no_row_when_they_are_dropped(
    project, annotator, grid_trajectory, label_steps
):
    label_steps(annotator, grid_trajectory(ACTIONS), {0: 0, 1: 0})
    assert rows(project, "stepwise", style="text") == []
    assert len(rows(project, "stepwise", style="text", neutral="negative")) == 1


def test_annotators_are_aggregated_per_step(project, annotator, other_annotator, grid_trajectory, label_steps):
    trajectory = grid_trajectory(ACTIONS)
    label_steps(annotator, trajectory, {0: 1, 1: 1, 2: -1})
    label_steps(other_annotator, trajectory, {0: 1, 1: -1, 2: -1})

    [majority] = rows(project, "stepwise", style="text")
    assert (majority["labels"], majority["step_indices"], majority["agreement"]) == ([True, False], [0, 2], 1.0)
    assert majority["annotator_ids"] == sorted([annotator.pk, other_annotator.pk])
    # The contested step 1 stays as context in front of step 2.
    assert majority["completions"][1].count("\nUser: ") == 2

    per_annotator = rows(project, "stepwise", style="text", aggregate="all")
    assert [row["annotator_ids"] for row in per_annotator] == [[annotator.pk], [other_annotator.pk]]
    assert [row["labels"] for row in per_annotator] == [[True, True, False], [True, False, False]]
    assert [row["agreement"] for row in per_annotator] == [0.5, 0.5]

    assert rows(project, "stepwise", style="text", min_agreement="0.9")[0]["step_indices"] == [0, 2]
