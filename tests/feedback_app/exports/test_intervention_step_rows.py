"""Stepwise rows implied by interventions (RLIF): steps before the intervened one accepted, that one rejected."""

from __future__ import annotations

import pytest

from feedback_app.exports import ExportFilters, ExportFormat, ExportKind, ExportRequestError, export_chunks
from feedback_app.exports.stream import RowTally
from feedback_app.models import Intervention, PolicyVersion, StepLabel
from reward_models.policy.turns import transcript
from tests.feedback_app.exports.helpers import prompt_until, rows, steps_of, turns_from
from tests.feedback_app.labels import stored_intervention

ACTIONS = ["right", "up", "down", "left"]


@pytest.fixture
def intervene():
    def make(annotator, trajectory, index: int, corrected_action: str = "right", **fields) -> Intervention:
        step = trajectory.steps.get(index=index)
        return stored_intervention(annotator, step, corrected_action, step.reasoning, **fields)

    return make


def transcript_through(trajectory, last_step: int) -> str:
    return transcript(prompt_until(trajectory, 0) + turns_from(trajectory, 0)[: 1 + 2 * last_step])


def test_steps_before_the_intervention_are_accepted_and_the_intervened_one_rejected(
    project, annotator, grid_trajectory, intervene
):
    trajectory = grid_trajectory(ACTIONS)
    intervention = intervene(annotator, trajectory, 2, corrected_action="right", reason="down hits the wall")

    [row] = rows(project, "stepwise", style="text")

    assert row["source"] == "intervention"
    assert (row["labels"], row["step_indices"]) == ([True, True, False], [0, 1, 2])
    # One piece per step through the intervened one, which is the original decision, as the policy made it.
    assert row["prompt"] + "".join(row["completions"]) == transcript_through(trajectory, 2)
    assert row["completions"][2].endswith("; action " + steps_of(trajectory)[2].action)
    assert (row["label_ids"], row["annotator_ids"], row["agreement"]) == ([intervention.pk], [annotator.pk], 1.0)
    assert (row["trajectory_id"], row["task_id"]) == (trajectory.pk, trajectory.task_id)


def test_an_intervention_at_the_first_step_rejects_just_that_step(project, annotator, grid_trajectory, intervene):
    trajectory = grid_trajectory(ACTIONS)
    intervene(annotator, trajectory, 0, corrected_action="down")
    [row] = rows(project, "stepwise", style="text")
    assert (row["labels"], row["step_indices"], len(row["completions"])) == ([False], [0], 1)


def test_human_step_labels_and_interventions_of_one_trajectory_stay_separate_rows(
    project, annotator, other_annotator, grid_trajectory, intervene
):
    trajectory = grid_trajectory(ACTIONS)
    steps = steps_of(trajectory)
    labels = [
        StepLabel.objects.create(project=project, annotator=annotator, step=steps[index], value=value)
        for index, value in ((0, 1), (1, -1), (3, 1))
    ]
    intervention = intervene(other_annotator, trajectory, 1)

    exported = rows(project, "stepwise", style="text")

    # Label rows first, then intervention rows; the intervention's implied "step 0 good, step 1 bad" is not merged
    # into the annotator's labels (which also judge step 3).
    assert [row["source"] for row in exported] == ["label", "intervention"]
    label_row, intervention_row = exported
    assert (label_row["labels"], label_row["step_indices"]) == ([True, False, True], [0, 1, 3])
    assert label_row["label_ids"] == sorted(label.pk for label in labels)
    assert (intervention_row["labels"], intervention_row["step_indices"]) == ([True, False], [0, 1])
    assert intervention_row["label_ids"] == [intervention.pk]

    only_labels = rows(project, "stepwise", style="text", interventions="exclude")
    assert only_labels == [label_row]


def test_only_the_current_revision_of_an_intervention_counts(project, annotator, grid_trajectory, intervene):
    trajectory = grid_trajectory(ACTIONS)
    first = intervene(annotator, trajectory, 1, corrected_action="down")
    revised = first.revise(corrected_action="right", reason="right is shorter")
    [row] = rows(project, "stepwise", style="text")
    assert row["label_ids"] == [revised.pk]
    assert row["step_indices"] == [0, 1]


def test_a_correction_that_repeats_the_original_rejects_nothing(project, annotator, grid_trajectory, intervene):
    trajectory = grid_trajectory(ACTIONS)
    intervene(annotator, trajectory, 1, corrected_action=steps_of(trajectory)[1].action)
    assert rows(project, "stepwise", style="text") == []


def test_each_annotators_intervention_is_its_own_row(project, annotator, other_annotator, grid_trajectory, intervene):
    trajectory = grid_trajectory(ACTIONS)
    mine = intervene(annotator, trajectory, 2)
    theirs = intervene(other_annotator, trajectory, 1, corrected_action="down")

    exported = rows(project, "stepwise", style="text")

    # In trajectory, step and id order; aggregation does not merge them (each is one annotator's whole judgement).
    assert [(row["step_indices"][-1], row["label_ids"]) for row in exported] == [(1, [theirs.pk]), (2, [mine.pk])]
    assert rows(project, "stepwise", style="text", aggregate="all") == exported
    assert rows(project, "stepwise", style="text", annotators=str(annotator.pk)) == [exported[1]]


def test_label_filters_choose_the_interventions(
    project, annotator, grid_trajectory, intervene, gold_assignment, external_policy
):
    other_policy = PolicyVersion.objects.create(project=project, name="agent-v2", kind="external")
    mine = grid_trajectory(ACTIONS)
    theirs = grid_trajectory(ACTIONS, policy=other_policy)
    regular = intervene(annotator, mine, 1)
    on_gold = intervene(annotator, theirs, 1, assignment=gold_assignment(annotator, theirs, kind="intervention"))

    def ids(**query):
        return sorted(label for row in rows(project, "stepwise", style="text", **query) for label in row["label_ids"])

    assert ids() == sorted([regular.pk, on_gold.pk])
    assert ids(exclude_gold="true") == [regular.pk]
    assert ids(policy_versions=str(external_policy.pk)) == [regular.pk]


def test_a_snapshot_cites_step_labels_and_interventions_by_kind(project, annotator, grid_trajectory, intervene):
    trajectory = grid_trajectory(ACTIONS)
    label = StepLabel.objects.create(project=project, annotator=annotator, step=steps_of(trajectory)[3], value=1)
    intervention = intervene(annotator, trajectory, 2)
    tally = RowTally(keep_ids=True)
    b"".join(export_chunks(project, ExportKind.STEPWISE, ExportFilters(), ExportFormat.PARQUET, tally))
    assert tally.row_ids() == [f"intervention:{intervention.pk}", f"step_label:{label.pk}"]


def test_the_interventions_option_applies_to_stepwise_only():
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"interventions": "exclude"}).check_kind(ExportKind.STEP_PREFERENCE)
    assert set(caught.value.errors) == {"interventions"}
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"interventions": "some"})
    assert caught.value.errors == {"interventions": "'some' is not one of exclude, include."}
