"""Storing labels: one function per kind, shared by the HTML views and the REST API.

Each function validates (a ValidationError whose keys name the fields) and stores the label through
`feedback_app.label_store`, so the rules are the same for every way in: one transaction, counted towards its queue
assignment, idempotent under a retried `client_token`, and append-only (a second submit for the same item, or
`edit_label`, writes a new revision).
"""

from __future__ import annotations

import random
import uuid

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from feedback_app import queue
from feedback_app.hot_path.labels import current_comparison
from feedback_app.label_store import (
    Stored,
    by_token,
    check_assignment,
    check_trajectory_label,
    seconds,
    step_of,
    store,
)
from feedback_app.models import Assignment, Trajectory
from feedback_app.models.labels import (
    Comparison,
    ComparisonChoice,
    Critique,
    Intervention,
    InterventionStatus,
    LabelBase,
    LabelKind,
    Rating,
    SpanField,
    StaleRevision,
    StepLabel,
    StepLabelValue,
)
from feedback_app.models.queue import AssignmentStatus
from reward_models.conversation import message_tool_calls
from reward_models.envs.base import describe_message, message_action
from training import launch


class StaleEdit(ValidationError):
    """The label was revised since the editor read it; the edit is refused (a 409 to the API)."""


DISPLAY_CHOICES = {"left", "right", ComparisonChoice.TIE, ComparisonChoice.BOTH_BAD}


def displayed_order(assignment: Assignment) -> str:
    """Which trajectory this assignment shows on the left: random across assignments, stable across reloads."""
    return random.Random(f"order-{assignment.pk}").choice(("ab", "ba"))


def canonical_choice(shown: str, order: str) -> str:
    """Translate a choice made on screen ("left", "right", "tie", "both_bad") to the stored a/b terms."""
    if shown not in DISPLAY_CHOICES:
        raise ValidationError({"choice": f"Choose left, right, tie or both_bad, not {shown!r}."})
    if shown == "left":
        return ComparisonChoice.A if order == "ab" else ComparisonChoice.B
    if shown == "right":
        return ComparisonChoice.B if order == "ab" else ComparisonChoice.A
    return shown


def shown_choice(choice: str, order: str) -> str:
    """The inverse of canonical_choice, to show a stored comparison the way its annotator saw it."""
    if choice == ComparisonChoice.A:
        return "left" if order == "ab" else "right"
    if choice == ComparisonChoice.B:
        return "right" if order == "ab" else "left"
    return choice


def submit_comparison(
    user,
    assignment: Assignment,
    *,
    choice: str,
    strength: int | None = 2,
    rationale: str = "",
    client_token: uuid.UUID | None = None,
    seconds_spent: float | None = None,
) -> Stored:
    """Store the annotator's comparison for a comparison assignment. `choice` is in a/b terms (canonical_choice)."""
    check_assignment(user, assignment, LabelKind.COMPARISON)
    item = assignment.item
    label = {"choice": choice, "strength": strength, "rationale": rationale, "order": displayed_order(assignment)}
    pair = (item.trajectory_id, item.other_trajectory_id)
    return _compare(user, item.project_id, pair, assignment, client_token, seconds_spent, **label)


def compare(
    user,
    trajectory_a: Trajectory,
    trajectory_b: Trajectory,
    *,
    choice: str,
    strength: int | None = 2,
    rationale: str = "",
    order: str = "ab",
    assignment: Assignment | None = None,
    client_token: uuid.UUID | None = None,
    seconds_spent: float | None = None,
) -> Stored:
    """Store a comparison of any two trajectories of one task; with an assignment, they must be its item's pair.
    `choice` and `order` (ab: trajectory_a was shown on the left) are relative to the trajectories as given; the
    pair is stored in canonical order (lower id first), its choice and order turned with it."""
    check_trajectory_label(user, trajectory_a, LabelKind.COMPARISON, None)
    if assignment is not None:
        check_assignment(user, assignment, LabelKind.COMPARISON, {trajectory_a.pk, trajectory_b.pk})
    if trajectory_a.pk > trajectory_b.pk:
        trajectory_a, trajectory_b = trajectory_b, trajectory_a
        choice = {ComparisonChoice.A: ComparisonChoice.B, ComparisonChoice.B: ComparisonChoice.A}.get(choice, choice)
        order = "ba" if order == "ab" else "ab"
    label = {"choice": choice, "strength": strength, "rationale": rationale, "order": order}
    pair = (trajectory_a.pk, trajectory_b.pk)
    return _compare(user, trajectory_a.project_id, pair, assignment, client_token, seconds_spent, **label)


def _compare(
    user,
    project_id: int,
    pair: tuple[int, int],
    assignment: Assignment | None,
    client_token: uuid.UUID | None,
    seconds_spent: float | None,
    *,
    choice: str,
    strength: int | None,
    rationale: str,
    order: str,
) -> Stored:
    leased = assignment is not None and assignment.status == AssignmentStatus.LEASED
    # A label completes its assignment in the same transaction, so while the assignment is leased no submit of it
    # has been stored yet and the token needs no lookup. A concurrent duplicate, or a token reused elsewhere, meets
    # the unique index in store() and gets the same answer as the lookup would give.
    if not leased and (earlier := by_token(Comparison, user, client_token, project_id)):
        return Stored(earlier, False)
    if choice not in ComparisonChoice.values:
        raise ValidationError({"choice": f"Choose one of {', '.join(ComparisonChoice.values)}, not {choice!r}."})
    if order not in ("ab", "ba"):
        raise ValidationError({"displayed_order": f"ab or ba, not {order!r}."})
    strength = Comparison.strength_for(choice, strength)
    if strength is not None and (not isinstance(strength, int) or not 1 <= strength <= 3):
        raise ValidationError({"strength": f"Strength is 1 (slight), 2 (clear) or 3 (decisive), not {strength!r}."})
    values = {"choice": choice, "strength": strength, "rationale": rationale.strip()}
    a, b = pair
    return store(
        Comparison,
        LabelKind.COMPARISON,
        user,
        assignment,
        current=lambda: Comparison.objects.filter(
            annotator=user, trajectory_a_id=a, trajectory_b_id=b, is_current=True
        ),
        locked_head=lambda: current_comparison(user.pk, a, b),
        new=Comparison(
            project_id=project_id,
            annotator=user,
            assignment=assignment,
            trajectory_a_id=a,
            trajectory_b_id=b,
            displayed_order=order,
            client_token=client_token,
            seconds_spent=seconds(assignment, seconds_spent),
            **values,
        ),
        changes=values,
        # A queue item's pair was checked when it was queued (two trajectories of one task, in canonical order), and
        # the database constraints still hold: skipping full_clean() saves some twenty queries on the annotators'
        # busiest request. A pair named by the caller is checked in full.
        validate=assignment is None,
        insert_first=leased,
    )


def label_step(
    user,
    trajectory: Trajectory,
    step_index: int,
    value: int,
    *,
    assignment: Assignment | None = None,
    client_token: uuid.UUID | None = None,
    seconds_spent: float | None = None,
) -> Stored:
    """Label one step +1 / 0 / -1. Labelling it again with another value writes a new revision."""
    check_trajectory_label(user, trajectory, LabelKind.STEP_LABEL, assignment)
    if value not in StepLabelValue.values:
        raise ValidationError({"value": f"A step label is +1, 0 or -1, not {value!r}."})
    if (earlier := by_token(StepLabel, user, client_token, trajectory.project_id)) is not None:
        return Stored(earlier, False)
    step = step_of(trajectory, step_index)
    return store(
        StepLabel,
        LabelKind.STEP_LABEL,
        user,
        assignment,
        current=lambda: StepLabel.objects.filter(annotator=user, step=step, is_current=True),
        new=StepLabel(
            project_id=trajectory.project_id,
            annotator=user,
            assignment=assignment,
            step=step,
            value=value,
            client_token=client_token,
            seconds_spent=seconds_spent,
        ),
        changes={"value": value},
    )


def label_first_error(
    user,
    trajectory: Trajectory,
    step_index: int,
    *,
    assignment: Assignment | None = None,
    client_token: uuid.UUID | None = None,
) -> list[StepLabel]:
    """The PRM800K shortcut: every step before `step_index` is +1 and this step is -1; later steps are untouched."""
    step_of(trajectory, step_index)
    values = {index: StepLabelValue.GOOD for index in range(step_index)} | {step_index: StepLabelValue.BAD}
    with transaction.atomic():
        return [
            label_step(
                user,
                trajectory,
                index,
                value,
                assignment=assignment,
                client_token=uuid.uuid5(client_token, str(index)) if client_token else None,
            ).label
            for index, value in values.items()
        ]


def finish_step_labels(user, assignment: Assignment) -> Assignment:
    """Hand in a step-label assignment. Every step up to the first -1 (or every step, if none is -1) needs a label."""
    check_assignment(user, assignment, LabelKind.STEP_LABEL)
    trajectory = assignment.item.trajectory
    labels = dict(
        StepLabel.objects.filter(annotator=user, step__trajectory=trajectory, is_current=True).values_list(
            "step__index", "value"
        )
    )
    first_error = min((index for index, value in labels.items() if value == StepLabelValue.BAD), default=None)
    needed = range(trajectory.num_steps if first_error is None else first_error + 1)
    missing = [index for index in needed if index not in labels]
    if missing:
        shown = ", ".join(str(index + 1) for index in missing[:10])
        raise ValidationError(
            {"steps": f"Label step{'s' if len(missing) > 1 else ''} {shown} first, or mark the first error."}
        )
    with transaction.atomic():
        return queue.complete(assignment)


def add_critique(
    user,
    trajectory: Trajectory,
    *,
    text: str,
    step_index: int | None = None,
    span_field: str = "",
    span_start: int | None = None,
    span_end: int | None = None,
    tags: list[str] | None = None,
    assignment: Assignment | None = None,
    client_token: uuid.UUID | None = None,
    seconds_spent: float | None = None,
) -> Stored:
    """A critique of the whole trajectory, of one step, or of a character span of one field of a step."""
    check_trajectory_label(user, trajectory, LabelKind.CRITIQUE, assignment)
    if (earlier := by_token(Critique, user, client_token, trajectory.project_id)) is not None:
        return Stored(earlier, False)
    if not text or not text.strip():
        raise ValidationError({"text": "Write the critique."})
    if (span_start is not None or span_end is not None) and step_index is None:
        raise ValidationError({"span_start": "A span needs the step it lies in."})
    if span_start is not None and span_field not in SpanField.values:
        # Critique.clean() reads the step's field by this name, so an unknown one must stop here.
        raise ValidationError(
            {"span_field": f"A span lies in a step's {', '.join(SpanField.values)}, not in {span_field!r}."}
        )
    step = step_of(trajectory, step_index) if step_index is not None else None
    tags = [tag.strip() for tag in (tags or []) if isinstance(tag, str) and tag.strip()]
    return store(
        Critique,
        LabelKind.CRITIQUE,
        user,
        assignment,
        current=Critique.objects.none,
        new=Critique(
            project_id=trajectory.project_id,
            annotator=user,
            assignment=assignment,
            trajectory=trajectory,
            step=step,
            span_field=span_field if span_start is not None else "",
            span_start=span_start,
            span_end=span_end,
            text=text.strip(),
            tags=tags,
            client_token=client_token,
            seconds_spent=seconds_spent,
        ),
        changes={},
    )


def rate(
    user,
    trajectory: Trajectory,
    *,
    score: int | None = None,
    thumb_up: bool | None = None,
    comment: str = "",
    assignment: Assignment | None = None,
    client_token: uuid.UUID | None = None,
    seconds_spent: float | None = None,
) -> Stored:
    """A trajectory-level rating: a 1–5 score, a thumb, or both. Rating again writes a new revision."""
    check_trajectory_label(user, trajectory, LabelKind.RATING, assignment)
    if (earlier := by_token(Rating, user, client_token, trajectory.project_id)) is not None:
        return Stored(earlier, False)
    if score is None and thumb_up is None:
        raise ValidationError({"score": "Give a score from 1 to 5, a thumb, or both."})
    if score is not None and not 1 <= score <= 5:
        raise ValidationError({"score": f"A score is from 1 to 5, not {score}."})
    values = {"score": score, "thumb_up": thumb_up, "comment": comment.strip()}
    return store(
        Rating,
        LabelKind.RATING,
        user,
        assignment,
        current=lambda: Rating.objects.filter(annotator=user, trajectory=trajectory, is_current=True),
        new=Rating(
            project_id=trajectory.project_id,
            annotator=user,
            assignment=assignment,
            trajectory=trajectory,
            client_token=client_token,
            seconds_spent=seconds_spent,
            **values,
        ),
        changes=values,
    )


def intervene(
    user,
    trajectory: Trajectory,
    *,
    step_index: int,
    corrected_action: str = "",
    corrected_reasoning: str = "",
    corrected_message: dict | None = None,
    takeover_actions: list | None = None,
    reason: str = "",
    assignment: Assignment | None = None,
    client_token: uuid.UUID | None = None,
    seconds_spent: float | None = None,
) -> Stored:
    """Replace the agent's turn at `step_index` (and play the takeover turns after it), then let the policy continue.

    The correction is an assistant message (`corrected_message`: an edited tool call, or free text), or an action
    picked from the environment's legal ones (`corrected_action`, with the annotator's `corrected_reasoning`), which
    the environment writes as its agents do; takeover turns are either. It is checked against the environment before
    anything is stored; the continuation runs on the rollouts queue once the transaction commits.
    """
    from feedback_app.corrections import validate_correction
    from reward_models.envs.corrections import turn_message

    check_trajectory_label(user, trajectory, LabelKind.INTERVENTION, assignment)
    if (earlier := by_token(Intervention, user, client_token, trajectory.project_id)) is not None:
        return Stored(earlier, False)
    step = step_of(trajectory, step_index)
    corrected_action = corrected_action.strip()
    takeover = [turn.strip() if isinstance(turn, str) else turn for turn in (takeover_actions or [])]
    takeover = [turn for turn in takeover if turn]
    if corrected_message is None and not corrected_action:
        raise ValidationError({"corrected_action": "Write or pick the corrected action."})
    env = trajectory.project.environment.load()
    corrected = (
        corrected_message
        if corrected_message is not None
        else turn_message(env, corrected_action, corrected_reasoning.strip())
    )
    takeover_messages = [turn_message(env, turn) for turn in takeover]
    if message_action(env, corrected) == message_action(env, step.message) and not takeover_messages:
        raise ValidationError({"corrected_action": "This is the action the policy took; choose a different one."})
    validate_correction(trajectory, step.index, corrected, takeover_messages)
    reasoning, action = describe_message(env, corrected, message_tool_calls(corrected))
    values = {
        "corrected_message": corrected,
        "corrected_action": action or corrected_action,
        "corrected_reasoning": corrected_reasoning.strip() if corrected_message is None else reasoning,
        "takeover_actions": takeover,
        "reason": reason.strip(),
    }
    stored = store(
        Intervention,
        LabelKind.INTERVENTION,
        user,
        assignment,
        current=lambda: Intervention.objects.filter(annotator=user, step=step, is_current=True),
        new=Intervention(
            project_id=trajectory.project_id,
            annotator=user,
            assignment=assignment,
            trajectory=trajectory,
            step=step,
            original_message=step.message,
            original_action=step.action,
            original_reasoning=step.reasoning,
            client_token=client_token,
            seconds_spent=seconds_spent,
            **values,
        ),
        changes=values,
    )
    if stored.created:
        launch.send_continuation(stored.label.pk)
    return stored


def edit_label(user, label: LabelBase, **changes) -> LabelBase:
    """Write a new revision of the user's own label. A stale edit (someone revised it first) is refused with
    StaleEdit; a retried edit carrying the same `client_token` returns the revision it stored."""
    if label.annotator_id != user.pk:
        raise PermissionDenied("Only the annotator who made a label may revise it.")
    if (earlier := by_token(type(label), user, changes.get("client_token"), label.project_id)) is not None:
        return earlier
    try:
        with transaction.atomic():
            new = label.revise(**changes)
            if isinstance(new, Intervention):
                _carry_continuation(label.pk, new)
    except StaleRevision as exc:
        raise StaleEdit(
            {"revision": "This label was changed since you opened it; reload it and revise its current revision."}
        ) from exc
    return new


def _carry_continuation(old_pk: int, new: Intervention) -> None:
    """Only the explanation of a correction is revised (a different action is a different branch, made as a new
    intervention), so a continuation the old revision finished stands for the new one. One not finished yet gives
    way to the new revision (training.interventions), which is continued instead."""
    old = Intervention.objects.only("status", "child_trajectory", "error").get(pk=old_pk)
    if old.status == InterventionStatus.DONE:
        new.status, new.child_trajectory_id, new.error = old.status, old.child_trajectory_id, old.error
        new.save(update_fields=["status", "child_trajectory", "error"])
    else:
        launch.send_continuation(new.pk)
