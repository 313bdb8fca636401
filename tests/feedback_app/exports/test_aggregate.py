from __future__ import annotations

from feedback_app.exports.aggregate import Vote, aggregate
from feedback_app.exports.filters import Aggregation

TWO_TO_ONE = [Vote(1, 10, "a"), Vote(2, 11, "a"), Vote(3, 12, "b")]


def test_majority_keeps_the_most_common_value_with_its_supporters():
    [verdict] = aggregate(TWO_TO_ONE, Aggregation.MAJORITY)
    assert verdict.value == "a"
    assert [vote.label_id for vote in verdict.supporting] == [1, 2]
    assert [vote.label_id for vote in verdict.considered] == [1, 2, 3]
    assert verdict.agreement == 2 / 3


def test_majority_gives_nothing_for_a_tied_vote():
    assert aggregate([Vote(1, 10, "a"), Vote(2, 11, "b")], Aggregation.MAJORITY) == []
    assert aggregate([Vote(1, 10, "a"), Vote(2, 11, "a"), Vote(3, 12, "b"), Vote(4, 13, "b")], "majority") == []


def test_drop_keeps_only_unanimous_items():
    assert aggregate(TWO_TO_ONE, Aggregation.DROP) == []
    [verdict] = aggregate(TWO_TO_ONE[:2], Aggregation.DROP)
    assert (verdict.value, verdict.agreement) == ("a", 1.0)


def test_all_gives_one_verdict_per_label_with_the_items_agreement():
    verdicts = aggregate(TWO_TO_ONE, Aggregation.ALL)
    assert [(v.value, [vote.label_id for vote in v.considered]) for v in verdicts] == [
        ("a", [1]),
        ("a", [2]),
        ("b", [3]),
    ]
    assert {v.agreement for v in verdicts} == {2 / 3}


def test_min_agreement_drops_contested_items_whatever_the_aggregation():
    for how in Aggregation:
        assert aggregate(TWO_TO_ONE, how, min_agreement=0.7) == []
    assert aggregate(TWO_TO_ONE, Aggregation.MAJORITY, min_agreement=0.6)


def test_no_votes_give_no_verdict():
    assert aggregate([], Aggregation.ALL) == []
