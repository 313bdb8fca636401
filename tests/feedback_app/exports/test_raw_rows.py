from __future__ import annotations

import json

from feedback_app.exports.raw import RAW_COLUMNS
from feedback_app.models import Rating, StepLabel
from tests.feedback_app.exports.helpers import rows, steps_of


def test_raw_holds_every_revision_with_its_history_and_context(
    project, annotator, other_annotator, grid_trajectory, compare, gold_assignment
):
    first, second = grid_trajectory(["up", "left"]), grid_trajectory(["right"])
    original = compare(annotator, second, first, rationale="first try")
    second_revision = original.revise(choice="a", rationale="second thoughts")
    third_revision = second_revision.revise(choice="tie", rationale="")
    on_gold = compare(other_annotator, first, second, assignment=gold_assignment(other_annotator, first, second))
    step_label = StepLabel.objects.create(project=project, annotator=annotator, step=steps_of(first)[0], value=0)
    rating = Rating.objects.create(project=project, annotator=annotator, trajectory=first, score=3)

    exported = rows(project, "raw")

    assert all(list(row) == RAW_COLUMNS for row in exported)
    comparisons = [row for row in exported if row["label_kind"] == "comparison"]
    assert [row["label_id"] for row in comparisons] == [original.pk, second_revision.pk, third_revision.pk, on_gold.pk]
    assert [row["first_revision_id"] for row in comparisons[:3]] == [original.pk] * 3
    assert [row["is_current"] for row in comparisons] == [False, False, True, True]
    assert [row["choice"] for row in comparisons[:3]] == ["b", "a", "tie"]
    assert comparisons[0]["displayed_order"] == "ba"
    assert comparisons[0]["annotator"] == "annotator"
    assert comparisons[0]["seconds_spent"] == 4.0
    assert (comparisons[0]["is_gold"], comparisons[3]["is_gold"]) == (False, True)
    assert json.loads(comparisons[3]["gold_answer"]) == {"choice": "a"}
    by_kind = {row["label_kind"]: row for row in exported}
    assert (by_kind["step_label"]["label_id"], by_kind["step_label"]["value"]) == (step_label.pk, 0)
    assert (by_kind["rating"]["label_id"], by_kind["rating"]["score"]) == (rating.pk, 3)
    assert by_kind["rating"]["choice"] is None

    # A date filter that leaves the first revision out still finds the chain's root.
    later = rows(project, "raw", since=second_revision.created_at.isoformat())
    assert {row["first_revision_id"] for row in later if row["label_id"] == third_revision.pk} == {original.pk}
    assert [row["label_id"] for row in rows(project, "raw", exclude_gold="true")].count(on_gold.pk) == 0
