"""The annotator-time model: seconds per kind of label, read from and written as ``kind=seconds,...``."""

from __future__ import annotations

import math

import pytest

from feedback_app.annotator_time import AnnotatorTime
from feedback_app.models import LabelKind


def test_every_label_kind_has_a_cost_and_so_do_the_marks_and_takeover_steps():
    kinds = set(AnnotatorTime.kinds())
    assert set(LabelKind.values) <= kinds
    assert kinds - set(LabelKind.values) == {"first_error", "takeover_step"}
    assert all(AnnotatorTime().seconds(kind) > 0 for kind in kinds)


def test_a_value_changes_the_kinds_it_names_and_reads_back_what_it_writes():
    time = AnnotatorTime.parse(" comparison=25, step_label=4.5 ")
    assert (time.comparison, time.step_label, time.critique) == (25, 4.5, AnnotatorTime().critique)
    assert AnnotatorTime.parse(time.argument()) == time
    assert AnnotatorTime.parse("") == AnnotatorTime()
    assert time.seconds("step_label", 10) == 45
    assert time.intervention_seconds(3) == time.intervention + 2 * time.takeover_step


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("comparison", "'comparison': expected kind=seconds"),
        ("coffee=5", "'coffee=5': expected kind=seconds, the kind one of comparison, step_label"),
        ("critique=long", "critique: expected seconds, got 'long'"),
        ("rating=-1", "rating: expected seconds"),
        ("rating=nan", "rating: expected seconds"),
    ],
)
def test_a_bad_value_names_the_kind_and_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        AnnotatorTime.parse(text)


def test_infinite_seconds_are_refused():
    with pytest.raises(ValueError, match="comparison"):
        AnnotatorTime(comparison=math.inf)
