"""How a label row is written, for every kind: the checks every kind shares, and the idempotent insert-or-revise.

`feedback_app.labelling` has one function per kind on top of this; the HTML views and the REST API both call those
functions, so a label means the same whichever way it came in:
- a retried submit carrying the same `client_token` returns the label stored the first time (`created` False);
- a submit for an item the annotator already labelled writes a new revision of that label, or returns it unchanged
  when nothing differs;
- a label that answers a queue item of its own kind completes the item's assignment in the same transaction (a
  step-label item is handed in separately, once its steps are labelled); a label on a lost lease is refused
  (`queue.LeaseLost`).
"""

from __future__ import annotations

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
from feedback_app.models import Assignment, LabelKind, Step, Trajectory
from feedback_app.models.labels import LabelBase
from feedback_app.rows import Rows

# On a step-label item, the step page's other labels (critiques, ratings, interventions) answer the item too.
STEP_PAGE_KINDS = {LabelKind.STEP_LABEL, LabelKind.CRITIQUE, LabelKind.RATING, LabelKind.INTERVENTION}


@cache
def rows_of(model) -> Rows:
    """New labels are inserted with SQL written once; save() would build the INSERT again for each (there are no
    signal receivers on labels to miss)."""
    return Rows(model, "c")


@dataclass
class Stored:
    label: Any
    created: bool


def check_assignment(user, assignment: Assignment, kind: str, trajectory_ids: set[int] | None = None) -> None:
    """The assignment is the user's, and a label of `kind` about `trajectory_ids` answers its item."""
    if assignment.annotator_id != user.pk:
        raise PermissionDenied("This item is assigned to someone else.")
    item = assignment.item
    kinds = STEP_PAGE_KINDS if item.kind == LabelKind.STEP_LABEL else {item.kind}
    if kind not in kinds:
        raise ValidationError({"assignment": f"This item asks for a {item.get_kind_display().lower()}."})
    if trajectory_ids is not None and trajectory_ids != {item.trajectory_id, item.other_trajectory_id} - {None}:
        raise ValidationError({"assignment": "This assignment is for another item."})


def check_trajectory_label(user, trajectory: Trajectory, kind: str, assignment: Assignment | None) -> None:
    """The project collects `kind`, and the assignment, if any, is the user's and is about `trajectory`."""
    if kind not in trajectory.project.feedback_kinds:
        raise ValidationError({"kind": f"This project does not collect {LabelKind(kind).label.lower()}s."})
    if assignment is not None:
        check_assignment(user, assignment, kind, {trajectory.pk})


def step_of(trajectory: Trajectory, index: Any) -> Step:
    """The trajectory's step by its 0-based index, or a ValidationError on `step` that says what exists."""
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


def by_token(model, user, client_token, project_id: int | None = None) -> LabelBase | None:
    """The user's label stored with `client_token`, if any; a token already spent in another project is refused."""
    if client_token is None:
        return None
    stored = model.objects.filter(annotator=user, client_token=client_token).first()
    if stored is not None and project_id is not None and stored.project_id != project_id:
        raise ValidationError({"client_token": "This token was already used for a label in another project."})
    return stored


def seconds(assignment: Assignment | None, given: float | None) -> float | None:
    """The annotator's time on a label: as given, else the time since the assignment was leased (capped at the
    lease), else unknown."""
    if given is not None:
        if given < 0:
            raise ValidationError({"seconds_spent": "Time spent cannot be negative."})
        return given
    if assignment is None:
        return None
    elapsed = (timezone.now() - assignment.created_at).total_seconds()
    return min(max(elapsed, 0.0), timedelta(minutes=assignment.item.project.lease_minutes).total_seconds())


def store(
    model,
    kind: str,
    user,
    assignment: Assignment | None,
    *,
    current: Callable[[], QuerySet],
    new: LabelBase,
    changes: dict,
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
    complete = assignment is not None and assignment.item.kind == kind and kind != LabelKind.STEP_LABEL
    if assignment is not None:
        new.query_strategy = assignment.item.query_strategy
    try:
        if insert_first and complete and connection.vendor == "postgresql":
            if queue.insert_counted(rows_of(model), new, assignment):
                return Stored(new, True)
        with transaction.atomic():
            if insert_first and rows_of(model).insert(new, unless_conflict=True):
                label, created = new, True
            elif (head := locked_head() if locked_head else current().select_for_update().first()) is None:
                if validate:
                    new.full_clean(exclude=["assignment", "supersedes"])
                rows_of(model).insert(new)
                label, created = new, True
            elif all(getattr(head, name) == value for name, value in changes.items()):
                label, created = head, False
            else:
                label = head.revise(
                    **changes, client_token=new.client_token, seconds_spent=new.seconds_spent, assignment=assignment
                )
                created = True
            if complete:
                queue.complete(assignment)
    except IntegrityError:
        earlier = by_token(model, user, new.client_token) or current().first()
        if earlier is None:
            raise
        return Stored(earlier, False)
    return Stored(label, created)
