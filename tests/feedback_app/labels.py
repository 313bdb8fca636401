"""Storing labels directly for tests that read them back (quality, agreement, the dashboard)."""

from __future__ import annotations


def stored_comparison(project, user, a, b, choice, *, seconds=None, assignment=None, **fields):
    """A comparison by `user` of trajectories `a` and `b`, with the pair in canonical order (lower id first) as the
    label service stores it and `choice` naming `a` or `b` as given ("tie" and "both_bad" name neither). `fields` are
    the comparison's other fields (strength, rationale, displayed_order), stored as they come: a displayed_order
    must already be in canonical terms."""
    from feedback_app.models import Comparison

    low, high = sorted((a, b), key=lambda t: t.pk)
    if low is not a and choice in ("a", "b"):
        choice = "b" if choice == "a" else "a"
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
