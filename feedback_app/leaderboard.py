"""Bradley-Terry strengths of policy versions from human comparisons, with 95 % confidence intervals. No Django.

The model: P(i beats j) = sigmoid(s_i - s_j). Outcomes are ``(winner, loser, weight)`` triples; a tie is half a win
each way (`outcomes_from_choices` does that). Strengths only matter up to a common shift, so the fit maximises the
log-likelihood minus a light L2 prior, ``prior / 2 * sum(s_i ** 2)``: it keeps every strength finite (a version
that won every game would otherwise run off to infinity) and ties down versions the data do not connect. With
``prior = 0.1`` it weighs as much as a tenth of a game against an average opponent.

The fit is Newton's method on that concave objective (the Hessian is the Fisher information plus the prior, so it is
positive definite). The intervals are the Laplace / Wald ones: the covariance is the inverse of that Hessian at the
optimum, taken for strengths centred to mean zero (the shift every version shares is not measured by any game, so
it must not widen every interval). They are symmetric, strength +- 1.96 standard errors.

    >>> fit = fit_bradley_terry([("v2", "v1", 8), ("v1", "v2", 2)])
    >>> fit["v2"].strength > 0 > fit["v1"].strength
    True
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

Z95 = 1.959963984540054
DEFAULT_PRIOR = 0.1


@dataclass(frozen=True)
class Strength:
    """One item's fitted strength (logit scale, centred so the fitted items average 0) with its interval, and the
    games it rests on (weighted: a tie is half a win)."""

    item: Hashable
    strength: float
    stderr: float
    low: float
    high: float
    wins: float
    games: float

    @property
    def elo(self) -> float:
        """The same strength on the chess scale: 400 points is odds of 10 to 1; the average is 1000."""
        return 1000 + 400 / math.log(10) * self.strength


def outcomes_from_choices(
    rows: Iterable[tuple[Hashable, Hashable, str, float]],
) -> list[tuple[Hashable, Hashable, float]]:
    """Outcome triples from ``(item_a, item_b, choice, count)`` rows of comparison labels: "a" or "b" is a win,
    "tie" and "both_bad" are half a win each way. Rows comparing an item with itself say nothing and are left out.

    >>> outcomes_from_choices([("x", "y", "b", 2), ("x", "y", "tie", 1)])
    [('y', 'x', 2.0), ('x', 'y', 0.5), ('y', 'x', 0.5)]
    """
    outcomes = []
    for a, b, choice, count in rows:
        if a == b or not count:
            continue
        if choice == "a":
            outcomes.append((a, b, float(count)))
        elif choice == "b":
            outcomes.append((b, a, float(count)))
        elif choice in ("tie", "both_bad"):
            outcomes.extend([(a, b, count / 2), (b, a, count / 2)])
        else:
            raise ValueError(f"choice: {choice!r} is not one of a, b, tie, both_bad")
    return outcomes


def fit_bradley_terry(
    outcomes: Iterable[tuple[Hashable, Hashable, float]],
    *,
    prior: float = DEFAULT_PRIOR,
    z: float = Z95,
    tolerance: float = 1e-10,
    max_iterations: int = 100,
) -> dict[Hashable, Strength]:
    """Strengths of every item that appears in `outcomes`, by item. See the module docstring for the model."""
    if not prior > 0:
        raise ValueError(f"prior: must be positive to make the fit identifiable, not {prior!r}")
    wins: defaultdict[tuple[Hashable, Hashable], float] = defaultdict(float)
    for winner, loser, weight in outcomes:
        if winner == loser:
            raise ValueError(f"outcome: {winner!r} cannot beat itself")
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
            raise ValueError(f"weight: must be a finite number >= 0, not {weight!r}")
        wins[winner, loser] += weight
    items = sorted({item for pair in wins for item in pair}, key=repr)
    if not items:
        return {}
    index = {item: i for i, item in enumerate(items)}
    n = len(items)
    # Games between each unordered pair (i < j), and how many of them i won.
    games: defaultdict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])  # [i's wins, total]
    for (winner, loser), weight in wins.items():
        i, j = index[winner], index[loser]
        key = (min(i, j), max(i, j))
        games[key][0] += weight if i < j else 0.0
        games[key][1] += weight

    strengths = [0.0] * n
    objective = _log_posterior(strengths, games, prior)
    for _ in range(max_iterations):
        gradient, hessian = _gradient_and_hessian(strengths, games, prior)
        step = _solve(hessian, gradient)
        # Newton's step on a concave objective; halve it in the rare case it overshoots (very lopsided records).
        scale = 1.0
        while True:
            candidate = [s + scale * d for s, d in zip(strengths, step, strict=True)]
            value = _log_posterior(candidate, games, prior)
            if value >= objective - 1e-12 or scale < 1e-6:
                break
            scale /= 2
        strengths, improvement, objective = candidate, value - objective, value
        if max(abs(scale * d) for d in step) < tolerance or abs(improvement) < tolerance * 1e-3:
            break

    _, hessian = _gradient_and_hessian(strengths, games, prior)
    covariance = _centred(_inverse(hessian))
    mean = sum(strengths) / n
    record_wins = [0.0] * n
    record_games = [0.0] * n
    for (i, j), (i_wins, total) in games.items():
        record_wins[i] += i_wins
        record_wins[j] += total - i_wins
        record_games[i] += total
        record_games[j] += total
    fitted = {}
    for item, i in index.items():
        centred = strengths[i] - mean
        stderr = math.sqrt(max(covariance[i][i], 0.0))
        fitted[item] = Strength(
            item, centred, stderr, centred - z * stderr, centred + z * stderr, record_wins[i], record_games[i]
        )
    return fitted


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1 / (1 + math.exp(-x))
    e = math.exp(x)
    return e / (1 + e)


def _log_posterior(strengths: list[float], games, prior: float) -> float:
    total = -prior / 2 * sum(s * s for s in strengths)
    for (i, j), (i_wins, count) in games.items():
        d = strengths[i] - strengths[j]
        # log sigmoid(d) = -log(1 + e^-d), written to stay finite for large |d|.
        log_p = -math.log1p(math.exp(-d)) if d > -30 else d
        log_q = -math.log1p(math.exp(d)) if d < 30 else -d
        total += i_wins * log_p + (count - i_wins) * log_q
    return total


def _gradient_and_hessian(strengths: list[float], games, prior: float) -> tuple[list[float], list[list[float]]]:
    """The gradient of the log posterior and the negated Hessian (Fisher information plus the prior)."""
    n = len(strengths)
    gradient = [-prior * s for s in strengths]
    hessian = [[prior if r == c else 0.0 for c in range(n)] for r in range(n)]
    for (i, j), (i_wins, count) in games.items():
        p = _sigmoid(strengths[i] - strengths[j])
        gradient[i] += i_wins - count * p
        gradient[j] -= i_wins - count * p
        information = count * p * (1 - p)
        hessian[i][i] += information
        hessian[j][j] += information
        hessian[i][j] -= information
        hessian[j][i] -= information
    return gradient, hessian


def _cholesky(matrix: list[list[float]]) -> list[list[float]]:
    n = len(matrix)
    lower = [[0.0] * n for _ in range(n)]
    for r in range(n):
        for c in range(r + 1):
            total = matrix[r][c] - sum(lower[r][k] * lower[c][k] for k in range(c))
            lower[r][c] = math.sqrt(total) if r == c else total / lower[c][c]
    return lower


def _solve_lower(lower: list[list[float]], b: list[float]) -> list[float]:
    """Solve L L^T x = b."""
    n = len(b)
    y = [0.0] * n
    for r in range(n):
        y[r] = (b[r] - sum(lower[r][k] * y[k] for k in range(r))) / lower[r][r]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (y[r] - sum(lower[k][r] * x[k] for k in range(r + 1, n))) / lower[r][r]
    return x


def _solve(matrix: list[list[float]], b: list[float]) -> list[float]:
    return _solve_lower(_cholesky(matrix), b)


def _inverse(matrix: list[list[float]]) -> list[list[float]]:
    lower = _cholesky(matrix)
    n = len(matrix)
    columns = [_solve_lower(lower, [1.0 if r == c else 0.0 for r in range(n)]) for c in range(n)]
    return [[columns[c][r] for c in range(n)] for r in range(n)]


def _centred(covariance: list[list[float]]) -> list[list[float]]:
    """Cov(C s) = C Cov(s) C^T with C = I - 11^T / n: the covariance of strengths minus their mean."""
    n = len(covariance)
    row_means = [sum(row) / n for row in covariance]
    col_means = [sum(covariance[r][c] for r in range(n)) / n for c in range(n)]
    grand = sum(row_means) / n
    return [[covariance[r][c] - row_means[r] - col_means[c] + grand for c in range(n)] for r in range(n)]
