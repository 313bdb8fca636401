"""How often annotators preferred a policy version over its parent: counts of the current comparisons between two
versions' trajectories, and the win rate with its Wilson interval."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q

from feedback_app.models import Comparison, PolicyVersion

# A 95 % interval.
Z = 1.959963984540054


def human_win_rate(version: PolicyVersion) -> dict[str, Any] | None:
    """How often annotators preferred `version` over its parent (`win_rate_of_counts`), from every current comparison
    of one's trajectory against the other's, gold items included. None without a parent."""
    if version.parent_id is None:
        return None
    return human_win_rates([version])[version.pk]


def human_win_rates(versions: Iterable[PolicyVersion]) -> dict[int, dict[str, Any] | None]:
    """`human_win_rate` of each version, from one query for all of them."""
    versions = list(versions)
    wanted = {pk for version in versions for pk in (version.pk, version.parent_id) if pk is not None}
    counts = version_comparison_counts(versions[0].project_id, wanted, gold=True) if versions else []
    return {
        version.pk: None if version.parent_id is None else win_rate_of_counts(version.pk, version.parent_id, counts)
        for version in versions
    }


def version_comparison_counts(
    project_id: int, versions: Iterable[int] | None = None, *, gold: bool
) -> list[tuple[int, int, str, int]]:
    """(version of a, version of b, choice, count) over the current comparisons between trajectories of two policy
    versions (both among `versions`, when given), with or without the comparisons of gold items (chosen to be easy,
    they test the annotator more than the policy)."""
    comparisons = Comparison.objects.filter(
        project=project_id,
        is_current=True,
        trajectory_a__policy_version__isnull=False,
        trajectory_b__policy_version__isnull=False,
    )
    if not gold:
        comparisons = comparisons.filter(Q(assignment__isnull=True) | Q(assignment__item__is_gold=False))
    if versions is not None:
        versions = list(versions)
        comparisons = comparisons.filter(
            trajectory_a__policy_version__in=versions, trajectory_b__policy_version__in=versions
        )
    rows = (
        comparisons.order_by()
        .values_list("trajectory_a__policy_version", "trajectory_b__policy_version", "choice")
        .annotate(n=Count("pk"))
    )
    return list(rows)


def win_rate_of_counts(version: int, parent: int, counts: Iterable[tuple[int, int, str, int]]) -> dict[str, Any]:
    """The win rate of `version` against `parent` from `version_comparison_counts`: a tie or "both bad" counts half,
    and the interval is Wilson's at 95 %."""
    tally: dict[str, int] = defaultdict(int)
    for version_a, version_b, choice, n in counts:
        if {version_a, version_b} != {version, parent}:
            continue  # another pair of versions, or two trajectories of the same version
        if choice in ("a", "b"):
            winner = version_a if choice == "a" else version_b
            tally["wins" if winner == version else "losses"] += n
        else:
            tally["ties"] += n
    n = tally["wins"] + tally["losses"] + tally["ties"]
    result: dict[str, Any] = {"parent": parent, "n": n, **{k: tally[k] for k in ("wins", "losses", "ties")}}
    if n == 0:
        return {**result, "value": None, "low": None, "high": None}
    rate = (tally["wins"] + tally["ties"] / 2) / n
    low, high = wilson_interval(rate, n)
    return {**result, "value": rate, "low": low, "high": high}


def wilson_interval(rate: float, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson's score interval for a proportion `rate` out of `n` (stays inside [0, 1], sane for small n)."""
    denominator = 1 + z * z / n
    centre = (rate + z * z / (2 * n)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
