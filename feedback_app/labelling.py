"""Storing labels: one function per kind, shared by the HTML views and the API.

Each function validates (a ValidationError whose keys name the fields), stores the label in one transaction, counts
it towards its queue assignment, and is idempotent: a retried submit that carries the same `client_token` returns
the label stored the first time (`created` is False) instead of storing a second one. Labels are append-only;
`edit_label` writes a new revision.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from feedback_app import queue
from feedback_app.models import (
    Assignment,
    Comparison,
    Critique,
    Intervention,
    LabelKind,
    Rating,
    Step,
    StepLabel,
    Trajectory,
)
from feedback_app.models.labels import ComparisonChoice, LabelBase, SpanField, StaleRevision, StepLabelValue
from feedback_app.models.queue import AssignmentStatus
from feedback_app.rows import Rows, fetch_one
from reward_models.conversation import message_tool_calls
from reward_models.envs.base import describe_message, message_action
from training import launch


@cache
def _rows(model) -> Rows:
    """New labels are inserted with SQL written once; save() would build the INSERT again for each (there are no
    signal receivers on labels to miss)."""
    return Rows(model, "c")


DISPLAY_CHOICES = {"left", "right", ComparisonChoice.TIE, ComparisonChoice.BOTH_BAD}


@dataclass
class Stored:
    label: Any
    created: bool


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


# The annotator's current comparison of a pair, its row locked: the `current` query of submit_comparison, in SQL
# written once (see feedback_app/rows.py). Parameters: annotator, trajectory a, trajectory b.
_CURRENT_COMPARISON_SQL = (
    f"SELECT {_rows(Comparison).columns} FROM {_rows(Comparison).table}"
    " WHERE c.annotator_id = %s AND c.trajectory_a_id = %s AND c.trajectory_b_id = %s AND c.is_current"
    + (" FOR UPDATE" if connection.features.has_select_for_update else "")
)


def _current_comparison(pair: list[int]) -> Comparison | None:
    row = fetch_one(_CURRENT_COMPARISON_SQL, pair)
    return None if row is None else _rows(Comparison).read(row)


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
    _check_assignment(user, assignment, LabelKind.COMPARISON)
    # A label completes its assignment in the same transaction, so while the assignment is leased no submit of it
    # has been stored yet and the token needs no lookup. A concurrent duplicate, or a token reused elsewhere, meets
    # the unique index in _store and gets the same answer as the lookup would give.
    if assignment.status != AssignmentStatus.LEASED and (earlier := _by_token(Comparison, user, client_token)):
        return Stored(earlier, False)
    if choice not in ComparisonChoice.values:
        raise ValidationError({"choice": f"Choose one of {', '.join(ComparisonChoice.values)}, not {choice!r}."})
    strength = Comparison.strength_for(choice, strength)
    if strength is not None and (not isinstance(strength, int) or not 1 <= strength <= 3):
        raise ValidationError({"strength": f"Strength is 1 (slight), 2 (clear) or 3 (decisive), not {strength!r}."})
    item = assignment.item
    values = {"choice": choice, "strength": strength, "rationale": rationale.strip()}
    pair = [user.pk, item.trajectory_id, item.other_trajectory_id]
    return _store(
        Comparison,
        user,
        assignment,
        current=lambda: Comparison.objects.filter(
            annotator=user,
            trajectory_a_id=item.trajectory_id,
            trajectory_b_id=item.other_trajectory_id,
            is_current=True,
        ),
        locked_head=lambda: _current_comparison(pair),
        new=Comparison(
            project_id=item.project_id,
            annotator=user,
            assignment=assignment,
            trajectory_a_id=item.trajectory_id,
            trajectory_b_id=item.other_trajectory_id,
            displayed_order=displayed_order(assignment),
            query_strategy=item.query_strategy,
            client_token=client_token,
            seconds_spent=_seconds(assignment, seconds_spent),
            **values,
        ),
        changes=values,
        complete=True,
        # Everything full_clean() would check is settled above or by the queue item (a stored pair of one task, in
        # canonical order), and the database constraints still hold; skipping it saves some twenty queries on the
        # annotators' busiest request.
        validate=False,
        insert_first=assignment.status == AssignmentStatus.LEASED,
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
    _check_trajectory_label(user, trajectory, LabelKind.STEP_LABEL, assignment, item_kind=LabelKind.STEP_LABEL)
    if value not in StepLabelValue.values:
        raise ValidationError({"value": f"A step label is +1, 0 or -1, not {value!r}."})
    if (earlier := _by_token(StepLabel, user, client_token)) is not None:
        return Stored(earlier, False)
    step = _step(trajectory, step_index)
    return _store(
        StepLabel,
        user,
        assignment,
        current=lambda: StepLabel.objects.filter(annotator=user, step=step, is_current=True),
        new=StepLabel(
            project_id=trajectory.project_id,
            annotator=user,
            assignment=assignment,
            step=step,
            value=value,
            query_strategy=assignment.item.query_strategy if assignment else "",
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
    _step(trajectory, step_index)
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
    _check_assignment(user, assignment, LabelKind.STEP_LABEL)
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
    _check_trajectory_label(user, trajectory, LabelKind.CRITIQUE, assignment)
    if (earlier := _by_token(Critique, user, client_token)) is not None:
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
    step = _step(trajectory, step_index) if step_index is not None else None
    tags = [tag.strip() for tag in (tags or []) if isinstance(tag, str) and tag.strip()]
    return _store(
        Critique,
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
    _check_trajectory_label(user, trajectory, LabelKind.RATING, assignment)
    if (earlier := _by_token(Rating, user, client_token)) is not None:
        return Stored(earlier, False)
    if score is None and thumb_up is None:
        raise ValidationError({"score": "Give a score from 1 to 5, a thumb, or both."})
    if score is not None and not 1 <= score <= 5:
        raise ValidationError({"score": f"A score is from 1 to 5, not {score}."})
    values = {"score": score, "thumb_up": thumb_up, "comment": comment.strip()}
    return _store(
        Rating,
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
    from feedback_app.interventions import turn_message, validate_correction

    _check_trajectory_label(user, trajectory, LabelKind.INTERVENTION, assignment)
    if (earlier := _by_token(Intervention, user, client_token)) is not None:
        return Stored(earlier, False)
    step = _step(trajectory, step_index)
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
    stored = _store(
        Intervention,
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
    """Write a new revision of the user's own label. A stale edit (someone revised it first) is refused."""
    if label.annotator_id != user.pk:
        raise PermissionDenied("You can only edit your own labels.")
    try:
        with transaction.atomic():
            new = label.revise(**changes)
    except StaleRevision as exc:
        raise ValidationError({"revision": "This label was changed since you opened it; reload to see it."}) from exc
    if isinstance(new, Intervention):
        launch.send_continuation(new.pk)
    return new


# Helpers ------------------------------------------------------------------------------------------------------------


def _check_assignment(user, assignment: Assignment, kind: str | None, trajectory: Trajectory | None = None) -> None:
    if assignment.annotator_id != user.pk:
        raise PermissionDenied("This item is assigned to someone else.")
    item = assignment.item
    if kind is not None and item.kind != kind:
        raise ValidationError({"assignment": f"This item asks for a {item.get_kind_display().lower()}."})
    if trajectory is not None and trajectory.pk not in (item.trajectory_id, item.other_trajectory_id):
        raise ValidationError({"assignment": "The trajectory is not part of this item."})


def _check_trajectory_label(
    user, trajectory: Trajectory, kind: str, assignment: Assignment | None, *, item_kind: str | None = None
) -> None:
    """The project collects `kind`, and the assignment, if any, is the user's and covers `trajectory`."""
    if kind not in trajectory.project.feedback_kinds:
        raise ValidationError({"kind": f"This project does not collect {LabelKind(kind).label.lower()}s."})
    if assignment is not None:
        _check_assignment(user, assignment, item_kind, trajectory)


def _step(trajectory: Trajectory, index: Any) -> Step:
    try:
        index = int(index)
    except (TypeError, ValueError):
        raise ValidationError({"step": f"A step number is an integer, not {index!r}."}) from None
    step = Step.objects.filter(trajectory=trajectory, index=index).first()
    if step is None:
        raise ValidationError(
            {"step": f"Trajectory {trajectory.pk} has no step {index + 1}; it has {trajectory.num_steps} steps."}
        )
    return step


def _by_token(model, user, client_token) -> LabelBase | None:
    if client_token is None:
        return None
    return model.objects.filter(annotator=user, client_token=client_token).first()


def _seconds(assignment: Assignment | None, given: float | None) -> float | None:
    if given is not None:
        if given < 0:
            raise ValidationError({"seconds_spent": "Time spent cannot be negative."})
        return given
    if assignment is None:
        return None
    elapsed = (timezone.now() - assignment.created_at).total_seconds()
    return min(max(elapsed, 0.0), timedelta(minutes=assignment.item.project.lease_minutes).total_seconds())


def _store(
    model,
    user,
    assignment,
    *,
    current: Callable[[], QuerySet],
    new: LabelBase,
    changes: dict,
    complete: bool = False,
    validate: bool = True,
    locked_head: Callable[[], LabelBase | None] | None = None,
    insert_first: bool = False,
) -> Stored:
    """Insert `new` (or revise the user's current label of the same item) and complete the assignment, atomically.

    A concurrent duplicate (same client token, or the same item submitted twice at once) loses the race on a
    unique index; the label that won is returned instead. `current()` gives the query of the user's current label of
    the same item (built only when it is needed: building it is a good part of a comparison submit's CPU), and
    `locked_head` reads what it holds, with its row locked, when the caller has a faster way.

    With `insert_first` (for a caller that has validated `new` and knows the user almost surely has no current label
    of the item, as on a leased assignment's first submit) `new` is inserted at once, unless a unique index holds
    another label it would clash with; only then is the current label looked up. That saves a statement on the
    annotators' busiest request. On PostgreSQL the insert and the completion are then one statement and no
    transaction (`queue.insert_counted`), if the lease is live.
    """
    try:
        if insert_first and complete and connection.vendor == "postgresql":
            if queue.insert_counted(_rows(model), new, assignment):
                return Stored(new, True)
        with transaction.atomic():
            if insert_first and _rows(model).insert(new, unless_conflict=True):
                label, created = new, True
            elif (head := locked_head() if locked_head else current().select_for_update().first()) is None:
                if validate:
                    new.full_clean(exclude=["assignment", "supersedes"])
                _rows(model).insert(new)
                label, created = new, True
            elif all(getattr(head, name) == value for name, value in changes.items()):
                label, created = head, False
            else:
                label = head.revise(
                    **changes, client_token=new.client_token, seconds_spent=new.seconds_spent, assignment=assignment
                )
                created = True
            if complete and assignment is not None:
                queue.complete(assignment)
    except IntegrityError:
        earlier = _by_token(model, user, new.client_token) or current().first()
        if earlier is None:
            raise
        return Stored(earlier, False)
    return Stored(label, created)
