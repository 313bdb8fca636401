"""Several annotators' current labels of one item (a pair, a step, a trajectory) into the verdicts that make rows.

The item's `agreement` is the share of its labels that hold the most common value: 1.0 when everyone agrees, 0.5
for a 2-2 split. It is the same for every row the item yields, whatever the aggregation.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

from feedback_app.exports.filters import Aggregation


class Vote(NamedTuple):
    """One current label of an item, reduced to what aggregation needs. `extra` carries kind-specific content
    (strength and rationale of a comparison) to the row builder."""

    label_id: int
    annotator_id: int
    value: Hashable
    extra: tuple = ()


class Verdict(NamedTuple):
    value: Hashable
    supporting: tuple[Vote, ...]  # the votes that hold `value`
    considered: tuple[Vote, ...]  # the votes the row is made from: all of the item's, or with `all` its own one
    agreement: float


def aggregate(votes: Sequence[Vote], how: Aggregation, min_agreement: float | None = None) -> list[Verdict]:
    """The verdicts of one item's votes.

    majority: the most common value, or nothing when the top values tie. drop: the common value only when all votes
    agree. all: one verdict per vote. An item whose agreement is below `min_agreement` yields nothing.

    >>> votes = [Vote(1, 10, "a"), Vote(2, 11, "a"), Vote(3, 12, "b")]
    >>> [v.value for v in aggregate(votes, Aggregation.MAJORITY)], aggregate(votes, Aggregation.DROP)
    (['a'], [])
    """
    if not votes:
        return []
    first = votes[0].value
    if all(vote.value == first for vote in votes):  # the common case: no counting, and any min_agreement passes
        if how == Aggregation.ALL:
            return [Verdict(first, (vote,), (vote,), 1.0) for vote in votes]
        votes = tuple(votes)
        return [Verdict(first, votes, votes, 1.0)]
    counts: dict[Hashable, int] = {}
    for vote in votes:
        counts[vote.value] = counts.get(vote.value, 0) + 1
    top = max(counts.values())
    share = top / len(votes)
    if min_agreement is not None and share < min_agreement:
        return []
    if how == Aggregation.ALL:
        return [Verdict(vote.value, (vote,), (vote,), share) for vote in votes]
    if len(counts) > 1 and (how == Aggregation.DROP or list(counts.values()).count(top) > 1):
        return []
    value = next(value for value, count in counts.items() if count == top)
    return [Verdict(value, tuple(vote for vote in votes if vote.value == value), tuple(votes), share)]
