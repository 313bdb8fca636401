"""Storing labels directly for tests that read them back (quality, agreement, the dashboard, the exports): a
comparison, a gold comparison item with its known answer, and an intervention."""

from __future__ import annotations

from tests.trajectories import correction


def _canonical(a, b, choice):
    """The pair in canonical order (lower id first) and `choice`, which names `a` or `b` as given, in those terms
    ("tie" and "both_bad" name neither)."""
    low, high = sorted((a, b), key=lambda t: t.pk)
    if low is not a and choice in ("a", "b"):
        choice = "b" if choice == "a" else "a"
    return low, high, choice


def stored_comparison(project, user, a, b, choice, *, seconds=None, assignment=None, **fields):
    """A comparison by `user` of trajectories `a` and `b`, with the pair in canonical order (lower id first) as the
    label service stores it and `choice` naming `a` or `b` as given ("tie" and "both_bad" name neither). `fields` are
    the comparison's other fields (strength, rationale, displayed_order), stored as they come: a displayed_order
    must already be in canonical terms."""
    from feedback_app.models import Comparison

    low, high, choice = _canonical(a, b, choice)
    return Comparison.objects.create(
        project=project,
        annotator=user,
        trajectory_a=low,
        trajectory_b=high,
        choice=choice,
        seconds_spent=seconds,
        assignment=assignment,
        **fields,
    )


def gold_comparison_item(project, a, b, choice, **fields):
    """A gold queue item comparing trajectories `a` and `b`, in canonical order, whose known answer is `choice`
    naming `a` or `b` as given. `fields` are the item's other fields (overlap, completed_count)."""
    from feedback_app.models import QueueItem

    low, high, choice = _canonical(a, b, choice)
    return QueueItem.objects.create(
        project=project,
        kind="comparison",
        trajectory=low,
        other_trajectory=high,
        is_gold=True,
        gold_answer={"choice": choice},
        **fields,
    )


def stored_intervention(user, step, action, reasoning="", **fields):
    """An intervention by `user` that corrects `step` to the gridworld move `action` with `reasoning`, its verbatim
    fields as `correction` gives them. `fields` are its other fields (reason, status, child_trajectory, ...), and
    override those."""
    from feedback_app.models import Intervention

    trajectory = step.trajectory
    return Intervention.objects.create(
        project=trajectory.project,
        annotator=user,
        trajectory=trajectory,
        step=step,
        **{**correction(step, action, reasoning), **fields},
    )
