"""The invariants of the data model hold in the database itself, so a bad row is impossible even from a shell."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from feedback_app.models import (
    Assignment,
    Comparison,
    Critique,
    PolicyVersion,
    QueueItem,
    Rating,
    Step,
    StepLabel,
    TrainingRun,
    Trajectory,
)
from feedback_app.models.labels import StaleRevision

pytestmark = pytest.mark.django_db


def _raises_integrity(make):
    with pytest.raises(IntegrityError), transaction.atomic():
        make()


def test_step_index_is_unique_per_trajectory(make_trajectory):
    trajectory = make_trajectory(n_steps=2)
    _raises_integrity(lambda: Step.objects.create(trajectory=trajectory, index=1, action="down"))


def test_branch_needs_both_parent_and_step(project, task, make_trajectory):
    parent = make_trajectory()
    _raises_integrity(lambda: Trajectory.objects.create(project=project, task=task, source="human", parent=parent))
    child = Trajectory.objects.create(project=project, task=task, source="human", parent=parent, branch_step_index=1)
    assert child.parent == parent


def test_policy_rollout_needs_a_policy_version(project, task):
    _raises_integrity(lambda: Trajectory.objects.create(project=project, task=task, source="policy"))


def test_external_id_is_unique_per_project(make_trajectory):
    make_trajectory(external_id="ep-1")
    _raises_integrity(lambda: make_trajectory(external_id="ep-1"))


def test_local_policy_needs_weights_and_endpoint_needs_url(project):
    _raises_integrity(lambda: PolicyVersion.objects.create(project=project, name="x", kind="local"))
    _raises_integrity(lambda: PolicyVersion.objects.create(project=project, name="y", kind="endpoint"))
    with pytest.raises(ValidationError) as excinfo:
        PolicyVersion(project=project, name="z", kind="endpoint").full_clean()
    assert "endpoint_url" in excinfo.value.message_dict


def test_policy_lineage_walks_parents(project):
    base = PolicyVersion.objects.create(project=project, name="base", kind="local", weights_path="/w/base")
    child = PolicyVersion.objects.create(project=project, name="v2", kind="local", weights_path="/w/2", parent=base)
    grandchild = PolicyVersion.objects.create(
        project=project, name="v3", kind="local", weights_path="/w/3", parent=child
    )
    assert [p.name for p in grandchild.lineage()] == ["v3", "v2", "base"]


def _comparison(project, annotator, a, b, **fields):
    fields.setdefault("choice", "a")
    return Comparison.objects.create(project=project, annotator=annotator, trajectory_a=a, trajectory_b=b, **fields)


def test_comparison_rejects_bad_choice_strength_and_order(project, annotator, make_trajectory):
    a, b = make_trajectory(), make_trajectory()
    _raises_integrity(lambda: _comparison(project, annotator, a, b, choice="maybe"))
    _raises_integrity(lambda: _comparison(project, annotator, a, b, strength=7))
    _raises_integrity(lambda: _comparison(project, annotator, b, a))


def test_one_current_label_per_annotator_and_item(project, annotator, other_annotator, make_trajectory):
    a, b = make_trajectory(), make_trajectory()
    _comparison(project, annotator, a, b)
    _raises_integrity(lambda: _comparison(project, annotator, a, b, choice="b"))
    # Another annotator labels the same pair freely.
    assert _comparison(project, other_annotator, a, b, choice="b").is_current


def test_revise_appends_a_revision_and_keeps_the_old_one(project, annotator, make_trajectory):
    a, b = make_trajectory(), make_trajectory()
    first = _comparison(project, annotator, a, b, rationale="shorter")
    second = first.revise(choice="tie", rationale="on reflection equal")
    first.refresh_from_db()
    assert (first.is_current, first.choice, first.rationale) == (False, "a", "shorter")
    assert (second.is_current, second.revision, second.supersedes_id, second.choice) == (True, 2, first.pk, "tie")
    assert [c.choice for c in second.history()] == ["a", "tie"]
    assert Comparison.objects.filter(annotator=annotator).count() == 2
    with pytest.raises(StaleRevision):
        first.revise(choice="b")


def test_labels_cannot_be_overwritten_in_place(project, annotator, make_trajectory):
    step = make_trajectory().steps.first()
    label = StepLabel.objects.create(project=project, annotator=annotator, step=step, value=1)
    label.value = -1
    with pytest.raises(ValidationError):
        label.save()
    label.refresh_from_db()
    assert label.value == 1


def test_step_label_value_must_be_plus_zero_or_minus_one(project, annotator, make_trajectory):
    step = make_trajectory().steps.first()
    _raises_integrity(lambda: StepLabel.objects.create(project=project, annotator=annotator, step=step, value=2))


def test_a_revision_chain_cannot_fork(project, annotator, make_trajectory):
    trajectory = make_trajectory()
    root = Rating.objects.create(project=project, annotator=annotator, trajectory=trajectory, score=3)
    root.revise(score=4)
    _raises_integrity(
        lambda: Rating.objects.create(
            project=project,
            annotator=annotator,
            trajectory=trajectory,
            score=5,
            revision=2,
            supersedes=root,
            is_current=False,
        )
    )


def test_client_token_makes_a_submit_idempotent(project, annotator, make_trajectory):
    import uuid

    token = uuid.uuid4()
    trajectory = make_trajectory()
    Rating.objects.create(project=project, annotator=annotator, trajectory=trajectory, score=4, client_token=token)
    _raises_integrity(
        lambda: Rating.objects.create(
            project=project, annotator=annotator, trajectory=make_trajectory(), score=2, client_token=token
        )
    )


def test_critique_span_must_be_ordered_and_inside_the_text(project, annotator, make_trajectory):
    trajectory = make_trajectory()
    step = trajectory.steps.get(index=0)  # reasoning "think 0": 7 characters
    ok = Critique(
        project=project,
        annotator=annotator,
        trajectory=trajectory,
        step=step,
        span_field="reasoning",
        span_start=0,
        span_end=5,
        text="vague",
    )
    ok.full_clean()
    too_long = Critique(
        project=project,
        annotator=annotator,
        trajectory=trajectory,
        step=step,
        span_field="reasoning",
        span_start=2,
        span_end=99,
        text="out of range",
    )
    with pytest.raises(ValidationError) as excinfo:
        too_long.full_clean()
    assert "span_end" in excinfo.value.message_dict
    _raises_integrity(
        lambda: Critique.objects.create(
            project=project,
            annotator=annotator,
            trajectory=trajectory,
            step=step,
            span_field="reasoning",
            span_start=4,
            span_end=2,
            text="backwards",
        )
    )


def test_a_rating_needs_a_score_or_a_thumb(project, annotator, make_trajectory):
    _raises_integrity(
        lambda: Rating.objects.create(project=project, annotator=annotator, trajectory=make_trajectory())
    )


def test_two_annotators_cannot_hold_the_same_live_slot(project, annotator, other_annotator, make_trajectory):
    item = QueueItem.objects.create(project=project, kind="rating", trajectory=make_trajectory(), overlap=2)
    until = timezone.now() + timedelta(minutes=5)
    first = Assignment.objects.create(item=item, annotator=annotator, slot=0, leased_until=until)
    _raises_integrity(
        lambda: Assignment.objects.create(item=item, annotator=other_annotator, slot=0, leased_until=until)
    )
    # An expired lease frees its slot.
    Assignment.objects.filter(pk=first.pk).update(status="expired")
    assert Assignment.objects.create(item=item, annotator=other_annotator, slot=0, leased_until=until).slot == 0
    # And an annotator never gets the same item twice.
    _raises_integrity(lambda: Assignment.objects.create(item=item, annotator=annotator, slot=1, leased_until=until))


def test_a_comparison_item_needs_two_distinct_trajectories(project, make_trajectory):
    t = make_trajectory()
    _raises_integrity(lambda: QueueItem.objects.create(project=project, kind="comparison", trajectory=t))
    _raises_integrity(
        lambda: QueueItem.objects.create(project=project, kind="comparison", trajectory=t, other_trajectory=t)
    )


def test_run_progress_cannot_exceed_total(project):
    _raises_integrity(
        lambda: TrainingRun.objects.create(project=project, kind="rollout", progress_current=5, progress_total=3)
    )
    _raises_integrity(lambda: TrainingRun.objects.create(project=project, kind="astrology"))
