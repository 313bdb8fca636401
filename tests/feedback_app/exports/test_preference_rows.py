from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from feedback_app.models import Comparison, PolicyVersion
from reward_models.policy.turns import render_prompt, transcript
from tests.feedback_app.exports.helpers import decision, prompt_until, rows, steps_of, turns_from
from tests.feedback_app.labels import stored_intervention

LEFT = ["up", "left", "down"]
RIGHT = ["right", "down"]


def test_the_preferred_trajectory_is_chosen_whatever_the_canonical_order(project, annotator, grid_trajectory, compare):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    label = compare(annotator, second, first, strength=3, rationale="it heads for the goal")
    assert label.choice == "b"

    [row] = rows(project, "preference")

    assert row["prompt"] == prompt_until(first, 0) == prompt_until(second, 0)
    assert row["chosen"] == turns_from(second, 0)
    assert row["rejected"] == turns_from(first, 0)
    assert (row["chosen_trajectory_id"], row["rejected_trajectory_id"]) == (second.pk, first.pk)
    assert row["margin"] == 1.0
    assert row["rationale"] == "it heads for the goal"
    assert row["annotator_ids"] == [annotator.pk]
    assert row["label_ids"] == [label.pk]
    assert row["agreement"] == 1.0
    assert row["task_id"] == first.task_id


def test_turns_alternate_decisions_and_observations_ending_with_a_decision(
    project, annotator, grid_trajectory, compare
):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    compare(annotator, first, second, strength=1)
    [row] = rows(project, "preference")
    roles = [message["role"] for message in row["chosen"]]
    assert roles == ["assistant", "user"] * (len(steps_of(first)) - 1) + ["assistant"]
    assert row["chosen"][0]["content"].endswith(f"; action {LEFT[0]}")
    assert row["margin"] == 0.0


def test_ties_and_both_bad_make_no_preference_rows(project, annotator, other_annotator, grid_trajectory, compare):
    first, second, third = grid_trajectory(LEFT), grid_trajectory(RIGHT), grid_trajectory(["down"])
    compare(annotator, first, second, choice="tie")
    compare(annotator, first, third, choice="both_bad")
    compare(other_annotator, first, third, choice="both_bad")
    assert rows(project, "preference") == []
    assert rows(project, "preference", aggregate="all") == []


def test_majority_of_three_annotators_gives_one_row_with_their_agreement(
    project, annotator, other_annotator, third_annotator, grid_trajectory, compare
):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    labels = [
        compare(annotator, first, second, strength=3, rationale="direct"),
        compare(other_annotator, first, second, strength=2),
        compare(third_annotator, second, first, rationale="no, shorter"),
    ]

    [row] = rows(project, "preference")

    assert row["chosen_trajectory_id"] == first.pk
    assert row["agreement"] == 2 / 3
    assert row["margin"] == 0.75  # the mean of the majority's margins, 1.0 and 0.5
    assert row["rationale"] == "direct"
    assert row["label_ids"] == sorted(label.pk for label in labels)
    assert row["annotator_ids"] == sorted(user.pk for user in (annotator, other_annotator, third_annotator))
    assert rows(project, "preference", min_agreement="0.7") == []
    assert rows(project, "preference", aggregate="drop") == []


def test_a_tied_vote_is_dropped_by_majority_but_kept_by_all(
    project, annotator, other_annotator, grid_trajectory, compare
):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    compare(annotator, first, second)
    compare(other_annotator, second, first)
    assert rows(project, "preference") == []
    both = rows(project, "preference", aggregate="all")
    assert sorted(row["chosen_trajectory_id"] for row in both) == sorted([first.pk, second.pk])
    assert [row["agreement"] for row in both] == [0.5, 0.5]
    assert all(len(row["label_ids"]) == 1 for row in both)


def test_only_the_current_revision_counts(project, annotator, grid_trajectory, compare):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    label = compare(annotator, first, second)
    revised = label.revise(choice="b" if label.choice == "a" else "a", rationale="changed my mind")
    [row] = rows(project, "preference")
    assert row["chosen_trajectory_id"] == second.pk
    assert row["label_ids"] == [revised.pk]
    assert row["rationale"] == "changed my mind"


def test_filters_choose_the_labels(
    project, annotator, other_annotator, grid_trajectory, compare, gold_assignment, external_policy
):
    other_policy = PolicyVersion.objects.create(project=project, name="agent-v2", kind="external")
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    third = grid_trajectory(["down"], policy=other_policy)
    regular = compare(annotator, first, second)
    on_gold = compare(other_annotator, first, third, assignment=gold_assignment(other_annotator, first, third))
    Comparison.objects.filter(pk=on_gold.pk).update(created_at=dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC))

    def ids(**query):
        return sorted(label for row in rows(project, "preference", **query) for label in row["label_ids"])

    assert ids() == sorted([regular.pk, on_gold.pk])
    assert ids(exclude_gold="true") == [regular.pk]
    assert ids(annotators=str(other_annotator.pk)) == [on_gold.pk]
    assert ids(policy_versions=str(external_policy.pk)) == [regular.pk]
    assert ids(policy_versions=f"{external_policy.pk},{other_policy.pk}") == sorted([regular.pk, on_gold.pk])
    assert ids(until="2024-05-01") == [on_gold.pk]
    assert ids(since="2024-05-02") == [regular.pk]


def test_the_text_style_renders_the_same_turns_as_the_policys_plain_prompt(
    project, annotator, grid_trajectory, compare
):
    first, second = grid_trajectory(LEFT), grid_trajectory(RIGHT)
    compare(annotator, first, second)
    [conversational] = rows(project, "preference")
    [text] = rows(project, "preference", style="text")

    no_template = SimpleNamespace(chat_template=None)
    assert text["prompt"] == render_prompt(no_template, conversational["prompt"])
    assert text["prompt"] + text["chosen"] == transcript(conversational["prompt"] + conversational["chosen"])
    assert text["prompt"] + text["rejected"] == transcript(conversational["prompt"] + conversational["rejected"])
    assert text["chosen"].startswith(" " + decision(steps_of(first)[0])["content"])


def test_it_builds_rows_without_a_query_per_row(project, annotator, grid_trajectory, compare):
    def queries_for_export() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as captured:
            count = len(rows(project, "preference"))
        return count, len(captured)

    trajectories = [grid_trajectory(LEFT), grid_trajectory(RIGHT)]
    compare(annotator, *trajectories)
    few_rows, few_queries = queries_for_export()
    for _ in range(12):
        trajectories.append(grid_trajectory(RIGHT))
        compare(annotator, trajectories[-1], trajectories[0])
    many_rows, many_queries = queries_for_export()
    assert (few_rows, many_rows) == (1, 13)
    assert many_queries == few_queries


def test_step_preference_pairs_a_correction_with_the_original_at_the_shared_prefix(
    project, annotator, grid_trajectory
):
    parent = grid_trajectory(LEFT)
    child = grid_trajectory(["up", "right", "down"], parent=parent, branch_step_index=1)
    step = steps_of(parent)[1]
    label = stored_intervention(
        annotator, step, "right", step.reasoning, reason="left walks away from the goal", child_trajectory=child
    )

    [row] = rows(project, "step_preference")

    assert row["source"] == "intervention"
    assert row["prompt"] == prompt_until(parent, 1)
    assert row["chosen"] == [decision(steps_of(child)[1])]
    assert row["rejected"] == [decision(step)]
    assert (row["chosen_trajectory_id"], row["rejected_trajectory_id"]) == (child.pk, parent.pk)
    assert (row["step_index"], row["label_ids"], row["rationale"]) == (1, [label.pk], "left walks away from the goal")


def test_step_preference_takes_comparisons_of_branches_at_the_step_where_they_part(
    project, annotator, grid_trajectory, compare
):
    parent = grid_trajectory(LEFT)
    child = grid_trajectory(["up", "right", "down"], parent=parent, branch_step_index=1)
    unrelated = grid_trajectory(RIGHT)
    label = compare(annotator, child, parent, rationale="better from step 1")
    compare(annotator, unrelated, parent)

    [row] = rows(project, "step_preference")

    assert row["source"] == "comparison"
    assert row["step_index"] == 1
    assert row["prompt"] == prompt_until(parent, 1) == prompt_until(child, 1)
    assert row["chosen"] == turns_from(child, 1)
    assert row["rejected"] == turns_from(parent, 1)
    assert row["label_ids"] == [label.pk]
    # Both comparisons are whole-trajectory preferences too.
    assert len(rows(project, "preference")) == 2


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_conversations_are_fetched_in_the_background_with_the_same_rows(
    project, annotator, other_annotator, grid_trajectory, compare, monkeypatch
):
    import threading

    from feedback_app.exports import conversation

    trajectories = [grid_trajectory(actions) for actions in (LEFT, RIGHT, ["down"], ["right", "right"])]
    for loser in trajectories[1:]:
        compare(annotator, trajectories[0], loser)
        compare(other_annotator, loser, trajectories[0])
    threads = set()
    fetch = conversation.fetch_conversations

    def recording_fetch(ids):
        threads.add(threading.current_thread().name)
        return fetch(ids)

    monkeypatch.setattr(conversation, "fetch_conversations", recording_fetch)
    monkeypatch.setattr("feedback_app.exports.rows.BATCH_ITEMS", 1)  # one pair per batch: many fetches ahead

    in_background = rows(project, "preference", aggregate="all")
    assert threads and all(name.startswith("export-fetch") for name in threads)
    threads.clear()
    with transaction.atomic():
        in_line = rows(project, "preference", aggregate="all")
    assert threads == {threading.current_thread().name}
    assert in_background == in_line
    assert len(in_line) == 6
