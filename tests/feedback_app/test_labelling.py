from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from feedback_app import labelling, queue
from feedback_app.models import Comparison, Critique, QueueItem, Rating, StepLabel
from feedback_app.models.queue import AssignmentStatus


@pytest.fixture
def comparison_assignment(project, annotator, make_trajectory):
    QueueItem.objects.enqueue_comparisons(project, [(make_trajectory(3), make_trajectory(4))])
    return queue.next_assignment(annotator, project)


@pytest.fixture
def step_assignment(project, annotator, make_trajectory):
    QueueItem.objects.enqueue_trajectories(project, [make_trajectory(4)])
    return queue.next_assignment(annotator, project)


def test_left_and_right_map_to_the_stored_canonical_choice():
    assert labelling.canonical_choice("left", "ab") == "a"
    assert labelling.canonical_choice("left", "ba") == "b"
    assert labelling.canonical_choice("right", "ba") == "a"
    assert labelling.canonical_choice("tie", "ba") == "tie"
    for choice, order in [("a", "ab"), ("a", "ba"), ("b", "ba"), ("both_bad", "ab")]:
        assert labelling.canonical_choice(labelling.shown_choice(choice, order), order) == choice


def test_an_unknown_choice_names_the_field():
    with pytest.raises(ValidationError) as error:
        labelling.canonical_choice("up", "ab")
    assert "choice" in error.value.message_dict


def test_the_displayed_order_is_stable_per_assignment_and_varies_across_assignments(project, make_trajectory):
    from feedback_app.models import Assignment

    orders = {labelling.displayed_order(Assignment(pk=pk)) for pk in range(1, 40)}
    assert orders == {"ab", "ba"}
    assert labelling.displayed_order(Assignment(pk=7)) == labelling.displayed_order(Assignment(pk=7))


def test_a_comparison_is_stored_with_its_order_and_completes_the_assignment(annotator, comparison_assignment):
    stored = labelling.submit_comparison(annotator, comparison_assignment, choice="b", strength=3, rationale=" short ")
    assert stored.created
    label = stored.label
    assert (label.choice, label.strength, label.rationale) == ("b", 3, "short")
    assert label.displayed_order == labelling.displayed_order(comparison_assignment)
    assert label.seconds_spent is not None and label.seconds_spent >= 0
    comparison_assignment.refresh_from_db()
    assert comparison_assignment.status == AssignmentStatus.DONE
    assert comparison_assignment.item.completed_count == 1


def test_on_postgresql_a_live_lease_s_label_is_stored_and_counted_in_one_statement(
    annotator, comparison_assignment, django_assert_num_queries
):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no data-modifying WITH; it stores and counts in a transaction")
    assert comparison_assignment.item.project.pk  # the view has the project already
    with django_assert_num_queries(1):  # no savepoint or transaction around it either
        stored = labelling.submit_comparison(annotator, comparison_assignment, choice="a", strength=1)
    assert stored.created and stored.label.pk is not None
    assert Comparison.objects.get(pk=stored.label.pk).choice == "a"
    comparison_assignment.refresh_from_db()
    assert comparison_assignment.status == AssignmentStatus.DONE and comparison_assignment.finished_at is not None
    assert comparison_assignment.item.completed_count == 1


def test_a_comparison_on_an_expired_lease_is_kept_while_the_item_needs_labels(annotator, comparison_assignment):
    from feedback_app.models import Assignment

    expired = timezone.now() - timedelta(minutes=1)
    Assignment.objects.filter(pk=comparison_assignment.pk).update(leased_until=expired)
    comparison_assignment.leased_until = expired
    stored = labelling.submit_comparison(annotator, comparison_assignment, choice="b")
    assert stored.created and Comparison.objects.filter(annotator=annotator, choice="b").count() == 1
    comparison_assignment.refresh_from_db()
    assert comparison_assignment.status == AssignmentStatus.DONE
    assert comparison_assignment.item.completed_count == 1


def test_a_retried_submit_with_the_same_token_stores_one_label(annotator, comparison_assignment):
    token = uuid.uuid4()
    first = labelling.submit_comparison(annotator, comparison_assignment, choice="a", client_token=token)
    again = labelling.submit_comparison(annotator, comparison_assignment, choice="a", client_token=token)
    assert first.created and not again.created
    assert again.label.pk == first.label.pk
    assert Comparison.objects.count() == 1


def test_a_double_submit_without_a_token_stores_one_label(annotator, comparison_assignment):
    labelling.submit_comparison(annotator, comparison_assignment, choice="a")
    comparison_assignment.refresh_from_db()
    labelling.submit_comparison(annotator, comparison_assignment, choice="a")
    assert Comparison.objects.count() == 1
    comparison_assignment.item.refresh_from_db()
    assert comparison_assignment.item.completed_count == 1


@pytest.mark.parametrize("same_token", [True, False], ids=["retried request", "second tab"])
def test_a_submit_through_a_copy_read_before_the_first_submit_counts_once(
    annotator, comparison_assignment, same_token
):
    from feedback_app.models import Assignment

    stale_copy = Assignment.objects.select_related("item").get(pk=comparison_assignment.pk)
    token = uuid.uuid4()
    labelling.submit_comparison(annotator, comparison_assignment, choice="a", client_token=token)
    again = labelling.submit_comparison(
        annotator, stale_copy, choice="a" if same_token else "b", client_token=token if same_token else uuid.uuid4()
    )
    assert again.created is not same_token  # another answer in a second tab is a new revision
    assert Comparison.objects.filter(is_current=True).count() == 1
    comparison_assignment.item.refresh_from_db()
    assert comparison_assignment.item.completed_count == 1
    assert Assignment.objects.get(pk=stale_copy.pk).status == AssignmentStatus.DONE


def test_a_tie_keeps_no_strength_and_a_revision_to_a_preference_gets_one(annotator, comparison_assignment):
    tie = labelling.submit_comparison(annotator, comparison_assignment, choice="tie", strength=3).label
    assert Comparison.objects.get(pk=tie.pk).strength is None
    preferred = tie.revise(choice="a")
    assert (preferred.choice, preferred.strength) == ("a", 2)  # a preference without a strength is clear
    both_bad = preferred.revise(choice="both_bad", strength=3)
    assert Comparison.objects.get(pk=both_bad.pk).strength is None


def test_an_out_of_range_strength_is_refused_and_nothing_is_stored(annotator, comparison_assignment):
    with pytest.raises(ValidationError) as error:
        labelling.submit_comparison(annotator, comparison_assignment, choice="a", strength=7)
    assert "strength" in error.value.message_dict
    assert Comparison.objects.count() == 0
    comparison_assignment.refresh_from_db()
    assert comparison_assignment.status == AssignmentStatus.LEASED


def test_it_rejects_a_submit_on_someone_else_s_assignment(other_annotator, comparison_assignment):
    with pytest.raises(PermissionDenied):
        labelling.submit_comparison(other_annotator, comparison_assignment, choice="a")


def test_a_label_on_a_lost_lease_is_refused_with_a_clear_message_and_not_stored(
    project, annotator, other_annotator, researcher, comparison_assignment
):
    from feedback_app.models import Assignment

    item = comparison_assignment.item
    Assignment.objects.filter(pk=comparison_assignment.pk).update(leased_until=timezone.now() - timedelta(minutes=1))
    for user in (other_annotator, researcher):
        labelling.submit_comparison(user, queue.next_assignment(user, project), choice="a")
    comparison_assignment.refresh_from_db()
    with pytest.raises(queue.LeaseLost, match="not stored"):
        labelling.submit_comparison(annotator, comparison_assignment, choice="b")
    assert not Comparison.objects.filter(annotator=annotator).exists()
    item.refresh_from_db()
    assert item.completed_count == 2


def test_first_error_labels_earlier_steps_good_and_this_step_bad(annotator, step_assignment):
    trajectory = step_assignment.item.trajectory
    labelling.label_first_error(annotator, trajectory, 2, assignment=step_assignment, client_token=uuid.uuid4())
    values = dict(StepLabel.objects.filter(annotator=annotator).values_list("step__index", "value"))
    assert values == {0: 1, 1: 1, 2: -1}
    labelling.finish_step_labels(annotator, step_assignment)
    step_assignment.refresh_from_db()
    assert step_assignment.status == AssignmentStatus.DONE


def test_relabelling_a_step_writes_a_revision(annotator, step_assignment):
    trajectory = step_assignment.item.trajectory
    first = labelling.label_step(annotator, trajectory, 0, 1, assignment=step_assignment).label
    second = labelling.label_step(annotator, trajectory, 0, -1, assignment=step_assignment).label
    same = labelling.label_step(annotator, trajectory, 0, -1, assignment=step_assignment)
    assert second.revision == 2 and second.supersedes_id == first.pk
    assert not same.created and same.label.pk == second.pk
    assert [label.value for label in second.history()] == [1, -1]


def test_finishing_step_labels_lists_the_unlabelled_steps(annotator, step_assignment):
    trajectory = step_assignment.item.trajectory
    labelling.label_step(annotator, trajectory, 0, 1, assignment=step_assignment)
    with pytest.raises(ValidationError) as error:
        labelling.finish_step_labels(annotator, step_assignment)
    assert error.value.message_dict["steps"] == ["Label steps 2, 3, 4 first, or mark the first error."]


def test_an_unknown_step_or_value_names_the_field(annotator, step_assignment):
    trajectory = step_assignment.item.trajectory
    with pytest.raises(ValidationError) as error:
        labelling.label_step(annotator, trajectory, 9, 1)
    assert "has no step 10" in error.value.message_dict["step"][0]
    with pytest.raises(ValidationError) as error:
        labelling.label_step(annotator, trajectory, 0, 2)
    assert "value" in error.value.message_dict


def test_a_span_critique_is_checked_against_the_step_text(annotator, make_trajectory):
    trajectory = make_trajectory(2)
    stored = labelling.add_critique(
        annotator, trajectory, text="wrong turn", step_index=1, span_field="reasoning", span_start=0, span_end=5
    )
    assert stored.label.step.index == 1 and stored.label.span_end == 5
    with pytest.raises(ValidationError) as error:
        labelling.add_critique(
            annotator, trajectory, text="x", step_index=1, span_field="reasoning", span_start=3, span_end=99
        )
    assert "outside" in error.value.message_dict["span_end"][0]
    assert Critique.objects.count() == 1


def test_a_critique_needs_text(annotator, make_trajectory):
    with pytest.raises(ValidationError) as error:
        labelling.add_critique(annotator, make_trajectory(2), text="   ")
    assert "text" in error.value.message_dict


def test_a_rating_needs_a_score_or_thumb_and_re_rating_revises(annotator, make_trajectory):
    trajectory = make_trajectory(2)
    with pytest.raises(ValidationError) as error:
        labelling.rate(annotator, trajectory)
    assert "score" in error.value.message_dict
    with pytest.raises(ValidationError):
        labelling.rate(annotator, trajectory, score=6)
    first = labelling.rate(annotator, trajectory, score=2).label
    second = labelling.rate(annotator, trajectory, score=4, thumb_up=True).label
    assert second.supersedes_id == first.pk
    assert Rating.objects.filter(is_current=True).count() == 1


def test_a_disabled_feedback_kind_is_refused(project, annotator, make_trajectory):
    project.feedback_kinds = ["comparison"]
    project.save()
    trajectory = make_trajectory(2)
    trajectory.project.refresh_from_db()
    with pytest.raises(ValidationError) as error:
        labelling.rate(annotator, trajectory, score=3)
    assert "kind" in error.value.message_dict


def test_editing_writes_a_revision_and_only_the_author_may_edit(annotator, other_annotator, make_trajectory):
    label = labelling.rate(annotator, make_trajectory(2), score=2).label
    with pytest.raises(PermissionDenied):
        labelling.edit_label(other_annotator, label, score=5)
    new = labelling.edit_label(annotator, label, score=5)
    assert new.revision == 2
    with pytest.raises(ValidationError) as error:
        labelling.edit_label(annotator, label, score=1)
    assert "revision" in error.value.message_dict
