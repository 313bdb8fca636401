"""`ties=include`: tie verdicts as `tie: true` rows in preference and step_preference exports."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from feedback_app.exports import ExportFilters, ExportFormat, ExportKind, ExportRequestError, export_chunks
from feedback_app.exports.schemas import export_schema
from feedback_app.exports.stream import RowTally
from tests.feedback_app.exports.helpers import as_in_jsonl, rows, turns_from
from tests.feedback_app.labels import stored_intervention

LEFT = ["up", "left", "down"]
RIGHT = ["right", "down"]


def test_a_tie_becomes_a_row_in_canonical_order_with_no_margin(project, annotator, grid_trajectory, compare):
    first, second, third = grid_trajectory(LEFT), grid_trajectory(RIGHT), grid_trajectory(["down"])
    # Shown with the later trajectory on the left, and decisive: neither changes a tie's row.
    tie = compare(annotator, second, first, choice="tie", strength=3, rationale="both reach it")
    assert tie.displayed_order == "ba"
    preferred = compare(annotator, third, first, strength=3)

    exported = rows(project, "preference", ties="include")

    [tie_row] = [row for row in exported if row["tie"]]
    assert (tie_row["chosen_trajectory_id"], tie_row["rejected_trajectory_id"]) == (first.pk, second.pk)
    assert tie_row["chosen"] == turns_from(first, 0)
    assert tie_row["rejected"] == turns_from(second, 0)
    assert (tie_row["margin"], tie_row["agreement"], tie_row["rationale"]) == (0.0, 1.0, "both reach it")
    assert tie_row["label_ids"] == [tie.pk]
    [plain] = [row for row in exported if not row["tie"]]
    assert (plain["chosen_trajectory_id"], plain["margin"], plain["label_ids"]) == (third.pk, 1.0, [preferred.pk])
    # Every row carries the column, last, as the schema says.
    assert all(list(row) == export_schema(ExportKind.PREFERENCE, ties="include").names for row in exported)
    assert list(exported[0])[-1] == "tie"


def test_by_default_ties_make_no_row_and_no_row_has_the_column(project, annotator, grid_trajectory, compare):
    first, second, third = grid_trajectory(LEFT), grid_trajectory(RIGHT), grid_trajectory(["down"])
    compare(annotator, first, second, choice="tie")
    compare(annotator, third, first)

    [row] = rows(project, "preference")

    assert "tie" not in row
    assert list(row) == export_schema(ExportKind.PREFERENCE).names
    assert rows(project, "preference", ties="drop") == [row]


def test_both_bad_is_not_a_tie(project, annotator, other_annotator, grid_trajectory, compare):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    compare(annotator, first, second, choice="both_bad")
    compare(other_annotator, first, second, choice="both_bad")
    assert rows(project, "preference", ties="include") == []
    assert rows(project, "preference", ties="include", aggregate="all") == []


def test_ties_are_aggregated_like_any_verdict(
    project, annotator, other_annotator, third_annotator, grid_trajectory, compare
):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    labels = [
        compare(annotator, first, second, choice="tie", rationale="same length"),
        compare(other_annotator, first, second, choice="tie"),
        compare(third_annotator, second, first, strength=3),
    ]

    [majority] = rows(project, "preference", ties="include")
    assert (majority["tie"], majority["margin"], majority["agreement"]) == (True, 0.0, 2 / 3)
    assert majority["label_ids"] == sorted(label.pk for label in labels)
    assert majority["rationale"] == "same length"
    assert rows(project, "preference", ties="include", aggregate="drop") == []

    per_label = rows(project, "preference", ties="include", aggregate="all")
    assert sorted((row["tie"], row["label_ids"][0]) for row in per_label) == sorted(
        [(True, labels[0].pk), (True, labels[1].pk), (False, labels[2].pk)]
    )
    [preference] = [row for row in per_label if not row["tie"]]
    assert (preference["chosen_trajectory_id"], preference["margin"]) == (second.pk, 1.0)


def test_a_tie_row_cites_its_labels_in_a_snapshot_tally(project, annotator, grid_trajectory, compare):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    tie = compare(annotator, first, second, choice="tie")
    tally = RowTally(keep_ids=True)
    filters = ExportFilters.from_query({"ties": "include"})
    b"".join(export_chunks(project, ExportKind.PREFERENCE, filters, ExportFormat.JSONL, tally))
    assert (tally.count, tally.row_ids()) == (1, [f"comparison:{tie.pk}"])


def test_parquet_and_jsonl_with_ties_agree_and_datasets_reads_the_column_as_bool(
    project, annotator, grid_trajectory, compare, tmp_path
):
    from datasets import load_dataset

    first, second, third = grid_trajectory(LEFT), grid_trajectory(RIGHT), grid_trajectory(["down"])
    compare(annotator, first, second, choice="tie")
    compare(annotator, third, first)
    filters = ExportFilters.from_query({"ties": "include"})
    jsonl = b"".join(export_chunks(project, ExportKind.PREFERENCE, filters, ExportFormat.JSONL))
    parquet = b"".join(export_chunks(project, ExportKind.PREFERENCE, filters, ExportFormat.PARQUET))

    table = pq.read_table(io.BytesIO(parquet))
    assert str(table.schema.field("tie").type) == "bool"
    assert as_in_jsonl(table.to_pylist()) == [json.loads(line) for line in jsonl.decode().splitlines()]
    (tmp_path / "prefs.jsonl").write_bytes(jsonl)
    dataset = load_dataset("json", data_files=str(tmp_path / "prefs.jsonl"), split="train")
    assert dataset.features["tie"].dtype == "bool"
    assert sorted(dataset["tie"]) == [False, True]


def test_step_preference_ties_between_branches_are_rows_and_corrections_are_not_ties(
    project, annotator, grid_trajectory, compare
):
    parent = grid_trajectory(["right", "up", "down"])
    child = grid_trajectory(["right", "down", "down"], parent=parent, branch_step_index=1)
    tie = compare(annotator, parent, child, choice="tie", rationale="as good")
    step = parent.steps.get(index=1)
    corrected = stored_intervention(annotator, step, "down", step.reasoning, child_trajectory=child)

    assert [row["source"] for row in rows(project, "step_preference")] == ["intervention"]
    exported = rows(project, "step_preference", ties="include")

    assert [(row["source"], row["tie"], row["label_ids"]) for row in exported] == [
        ("intervention", False, [corrected.pk]),
        ("comparison", True, [tie.pk]),
    ]
    tie_row = exported[1]
    assert (tie_row["chosen_trajectory_id"], tie_row["rejected_trajectory_id"]) == (parent.pk, child.pk)
    assert (tie_row["step_index"], tie_row["margin"], tie_row["rationale"]) == (1, 0.0, "as good")
    assert all(list(row) == export_schema(ExportKind.STEP_PREFERENCE, ties="include").names for row in exported)


@pytest.mark.parametrize("kind", [ExportKind.STEPWISE, ExportKind.UNPAIRED, ExportKind.SFT, ExportKind.RETURNS])
def test_ties_mean_nothing_for_other_kinds(kind):
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query({"ties": "include"}).check_kind(kind)
    assert set(caught.value.errors) == {"ties"}
    ExportFilters.from_query({"ties": "drop"}).check_kind(kind)
