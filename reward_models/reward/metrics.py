"""The reward model's held-out figures: accuracy, log-loss and calibration of the ensemble's P(chosen > rejected),
beside the "shorter trajectory wins" baseline, and the ensemble arithmetic (mean and spread over members)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def pairwise_metrics(
    differences: Sequence[Sequence[float]],
    rows: Sequence[Mapping[str, Any]],
    length_gaps: Sequence[int],
    ece_bins: int,
) -> dict[str, Any]:
    """Accuracy, log-loss and ECE of the ensemble's P(chosen > rejected) = mean over members of
    sigmoid(r_chosen - r_rejected), from `differences[member][row]`, overall and by ``pair_type``; the "shorter
    trajectory wins" baseline from `length_gaps` (tokens of chosen minus rejected); tie rows apart as their mean
    |P - 1/2|. A probability of exactly 1/2 counts as half right."""
    probabilities, spread = mean_and_std([[sigmoid(d) for d in member] for member in differences])
    ties = [index for index, row in enumerate(rows) if row.get("tie")]
    strict = [index for index, row in enumerate(rows) if not row.get("tie")]
    metrics: dict[str, Any] = _pair_figures(
        [probabilities[i] for i in strict], [length_gaps[i] for i in strict], ece_bins
    )
    if spread is not None:
        metrics["mean_member_std"] = mean(spread)
    by_type: dict[str, list[int]] = {}
    for index in strict:
        if rows[index].get("pair_type"):
            by_type.setdefault(str(rows[index]["pair_type"]), []).append(index)
    if by_type:
        metrics["by_pair_type"] = {
            name: _pair_figures([probabilities[i] for i in indices], [length_gaps[i] for i in indices], ece_bins)
            for name, indices in sorted(by_type.items())
        }
    metrics["tie_pairs"] = len(ties)
    if ties:
        metrics["tie_mean_abs_gap"] = mean([abs(probabilities[i] - 0.5) for i in ties])
    return metrics


def _pair_figures(probabilities: Sequence[float], length_gaps: Sequence[int], ece_bins: int) -> dict[str, Any]:
    if not probabilities:
        return {"pairs": 0}
    shorter_wins = [1.0 if gap < 0 else 0.0 if gap > 0 else 0.5 for gap in length_gaps]
    return {
        "pairs": len(probabilities),
        "accuracy": mean([1.0 if p > 0.5 else 0.0 if p < 0.5 else 0.5 for p in probabilities]),
        "log_loss": mean([-math.log(max(p, 1e-12)) for p in probabilities]),
        "ece": expected_calibration_error(probabilities, ece_bins),
        "shorter_wins_accuracy": mean(shorter_wins),
    }


def expected_calibration_error(probabilities: Sequence[float], bins: int = 10) -> float:
    """ECE of P(chosen > rejected) over `bins` equal-width bins of [0, 1]. A pair's order is arbitrary, so each pair
    counts twice, as (p, chosen won) and (1 - p, rejected lost); otherwise every outcome would be "the first won"
    and the figure would only measure how close to 1 the probabilities are."""
    points = [(p, 1.0) for p in probabilities] + [(1.0 - p, 0.0) for p in probabilities]
    totals: dict[int, list[float]] = {}
    for p, outcome in points:
        slot = totals.setdefault(min(int(p * bins), bins - 1), [0.0, 0.0, 0.0])
        slot[0] += p
        slot[1] += outcome
        slot[2] += 1
    return sum(abs(p_sum - won) for p_sum, won, _ in totals.values()) / len(points)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def mean_and_std(per_member: Sequence[Sequence[float]]) -> tuple[list[float], list[float] | None]:
    """Column means over members and, for more than one member, their population standard deviation."""
    columns = list(zip(*per_member, strict=True))
    means = [mean(column) for column in columns]
    if len(per_member) == 1:
        return means, None
    stds = [math.sqrt(mean([(v - m) ** 2 for v in column])) for column, m in zip(columns, means, strict=True)]
    return means, stds
