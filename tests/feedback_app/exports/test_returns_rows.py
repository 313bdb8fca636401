"""The `returns` export for the value critic: one row per trajectory, its steps and their environment rewards."""

from __future__ import annotations

import datetime as dt
import io
import json

import pyarrow.parquet as pq
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from feedback_app.exports import (
    ExportFilters,
    ExportFormat,
    ExportKind,
    ExportRequestError,
    create_snapshot,
    export_chunks,
)
from feedback_app.exports.filters import Style
from feedback_app.exports.schemas import export_schema
from feedback_app.models import PolicyVersion, Trajectory
from reward_models.policy.turns import transcript
from tests.feedback_app.exports.helpers import as_in_jsonl, prompt_until, rows, steps_of, turns_from

RIGHT = ["right", "right", "down", "down"]
LEFT = ["up", "left", "down"]


def set_rewards(trajectory, rewards: list[float]) -> None:
    for step, reward in zip(steps_of(trajectory), rewards, strict=True):
        step.env_reward = reward
        step.save(update_fields=["env_reward"])


def test_a_row_is_a_whole_trajectory_with_one_piece_and_one_reward_per_step(project, grid_trajectory, external_policy):
    trajectory = grid_trajectory(RIGHT, source="policy")
    set_rewards(trajectory, [0.0, 0.0, 0.0, 1.0])
    Trajectory.objects.filter(pk=trajectory.pk).update(success=True)

    [row] = rows(project, "returns", style="text")

    steps = steps_of(trajectory)
    assert len(row["completions"]) == len(steps) == 4
    assert row["prompt"] == "System: reach the goal G\nUser: " + steps[0].observation + "\nAssistant:"
    whole = transcript(prompt_until(trajectory, 0) + turns_from(trajectory, 0))
    assert row["prompt"] + "".join(row["completions"]) == whole
    assert row["completions"][1].startswith("\nUser: " + steps[1].observation + "\nAssistant: ")
    assert (row["rewards"], row["success"]) == ([0.0, 0.0, 0.0, 1.0], True)
    assert (row["trajectory_id"], row["task_id"], row["policy_version_id"]) == (
        trajectory.pk,
        trajectory.task_id,
        external_policy.pk,
    )
    assert list(row) == export_schema(ExportKind.RETURNS, Style.TEXT).names
    assert list(row)[:4] == ["prompt", "completions", "rewards", "success"]


def test_a_conversational_row_holds_the_messages_cut_at_each_step_and_the_tools(project, grid_trajectory):
    trajectory = grid_trajectory(RIGHT, source="policy")
    set_rewards(trajectory, [0.0, 0.0, 0.0, 1.0])

    [row] = rows(project, "returns")

    assert row["prompt"] == prompt_until(trajectory, 0)
    assert [message for piece in row["completions"] for message in piece] == turns_from(trajectory, 0)
    assert [piece[-1]["role"] for piece in row["completions"]] == ["assistant"] * 4, "each piece ends at a decision"
    assert row["completions"][1][0] == {"role": "user", "content": steps_of(trajectory)[1].observation}
    assert "tools" in row and row["rewards"] == [0.0, 0.0, 0.0, 1.0]
    assert list(row) == export_schema(ExportKind.RETURNS).names


def test_every_trajectory_with_steps_is_a_row_labelled_or_not(project, grid_trajectory):
    failed = grid_trajectory(LEFT)
    demonstration = grid_trajectory(RIGHT, source="human")
    branch = grid_trajectory(["up", "right"], parent=failed, branch_step_index=1)
    Trajectory.objects.create(project=project, task=failed.task, source="import")  # no steps: nothing to value

    exported = rows(project, "returns")

    assert [row["trajectory_id"] for row in exported] == [failed.pk, demonstration.pk, branch.pk]
    assert [row["success"] for row in exported] == [None, None, None]  # no outcome stored
    assert exported[1]["policy_version_id"] is None


def test_an_imported_trajectory_without_rewards_has_none_but_a_rollouts_zeros_are_real(project, grid_trajectory):
    imported_unrewarded = grid_trajectory(LEFT)
    imported_rewarded = grid_trajectory(RIGHT)
    rollout = grid_trajectory(LEFT, source="policy")
    Trajectory.objects.filter(pk=imported_unrewarded.pk).update(external_id="agent-run-1", success=False)
    Trajectory.objects.filter(pk=imported_rewarded.pk).update(external_id="agent-run-2")
    set_rewards(imported_rewarded, [-0.1, -0.1, 0.0, 1.5])

    by_id = {row["trajectory_id"]: row for row in rows(project, "returns")}

    assert by_id[imported_unrewarded.pk]["rewards"] is None
    assert by_id[imported_unrewarded.pk]["success"] is False
    assert by_id[imported_rewarded.pk]["rewards"] == [-0.1, -0.1, 0.0, 1.5]
    assert by_id[rollout.pk]["rewards"] == [0.0, 0.0, 0.0]


def test_filters_bound_the_trajectories_creation_and_version(project, grid_trajectory, external_policy):
    other_policy = PolicyVersion.objects.create(project=project, name="agent-v2", kind="external")
    old = grid_trajectory(LEFT)
    new = grid_trajectory(RIGHT, policy=other_policy)
    Trajectory.objects.filter(pk=old.pk).update(created_at=dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC))

    def ids(**query):
        return [row["trajectory_id"] for row in rows(project, "returns", **query)]

    assert ids() == [old.pk, new.pk]
    assert ids(until="2024-05-01") == [old.pk]
    assert ids(since="2024-05-02") == [new.pk]
    assert ids(policy_versions=str(other_policy.pk)) == [new.pk]
    assert ids(policy_versions=f"{external_policy.pk},{other_policy.pk}") == [old.pk, new.pk]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"annotators": "3"}, "annotators"),
        ({"exclude_gold": "true"}, "exclude_gold"),
        ({"aggregate": "all"}, "aggregate"),
        ({"min_agreement": "0.5"}, "min_agreement"),
        ({"neutral": "positive"}, "neutral"),
    ],
)
def test_label_options_are_refused_naming_the_field(query, field):
    with pytest.raises(ExportRequestError) as caught:
        ExportFilters.from_query(query).check_kind(ExportKind.RETURNS)
    assert set(caught.value.errors) == {field}


def test_it_builds_rows_without_a_query_per_row(project, grid_trajectory):
    def queries_for_export() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as captured:
            count = len(rows(project, "returns"))
        return count, len(captured)

    grid_trajectory(LEFT)
    few_rows, few_queries = queries_for_export()
    for _ in range(12):
        grid_trajectory(RIGHT)
    many_rows, many_queries = queries_for_export()
    assert (few_rows, many_rows) == (1, 13)
    assert many_queries == few_queries


def test_parquet_holds_null_rewards_and_matches_jsonl(project, grid_trajectory, tmp_path):
    from datasets import load_dataset

    unrewarded, rewarded = grid_trajectory(LEFT), grid_trajectory(RIGHT, source="policy")
    Trajectory.objects.filter(pk=unrewarded.pk).update(external_id="agent-run-1")
    set_rewards(rewarded, [0.0, 0.0, 0.0, 1.0])
    jsonl = b"".join(export_chunks(project, ExportKind.RETURNS, ExportFilters(), ExportFormat.JSONL))
    parquet = b"".join(export_chunks(project, ExportKind.RETURNS, ExportFilters(), ExportFormat.PARQUET))

    table = pq.read_table(io.BytesIO(parquet))
    assert as_in_jsonl(table.to_pylist()) == [json.loads(line) for line in jsonl.decode().splitlines()]
    assert table.column("rewards").to_pylist() == [None, [0.0, 0.0, 0.0, 1.0]]
    (tmp_path / "returns.parquet").write_bytes(parquet)
    dataset = load_dataset("parquet", data_files=str(tmp_path / "returns.parquet"), split="train")
    assert dataset[1]["rewards"] == [0.0, 0.0, 0.0, 1.0]
    assert dataset[0]["rewards"] is None


def test_a_snapshot_cites_its_trajectories(project, grid_trajectory, researcher, settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    snapshot = create_snapshot(project, "returns", ExportFilters(), user=researcher, name="values")
    assert snapshot.export_kind == "returns"
    assert (snapshot.row_count, snapshot.row_ids) == (2, [f"trajectory:{first.pk}", f"trajectory:{second.pk}"])
