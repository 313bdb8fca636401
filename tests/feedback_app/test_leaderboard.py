"""The Bradley-Terry fit behind the leaderboard (feedback_app/leaderboard.py): no Django, no database."""

from __future__ import annotations

import math
import random

import pytest

from feedback_app.leaderboard import fit_bradley_terry, outcomes_from_choices

TRUE = {"base": -1.0, "v1": 0.0, "v2": 0.6, "v3": 1.6}


def simulate(rng: random.Random, games: int, strengths=TRUE) -> list[tuple[str, str, float]]:
    names = list(strengths)
    outcomes = []
    for _ in range(games):
        x, y = rng.sample(names, 2)
        p = 1 / (1 + math.exp(-(strengths[x] - strengths[y])))
        outcomes.append((x, y, 1.0) if rng.random() < p else (y, x, 1.0))
    return outcomes


def test_it_recovers_the_ordering_of_known_strengths():
    fit = fit_bradley_terry(simulate(random.Random(1), 2000))
    assert sorted(fit, key=lambda k: fit[k].strength) == ["base", "v1", "v2", "v3"]
    centre = sum(TRUE.values()) / len(TRUE)
    for name, true in TRUE.items():
        assert fit[name].strength == pytest.approx(true - centre, abs=0.2)
    assert sum(s.strength for s in fit.values()) == pytest.approx(0, abs=1e-9)


def test_the_95_percent_intervals_cover_the_true_strengths_about_95_percent_of_the_time():
    rng = random.Random(7)
    centre = sum(TRUE.values()) / len(TRUE)
    covered = total = 0
    for _ in range(150):
        fit = fit_bradley_terry(simulate(rng, 300))
        for name, true in TRUE.items():
            total += 1
            covered += fit[name].low <= true - centre <= fit[name].high
    assert 0.90 <= covered / total <= 0.99


def test_intervals_narrow_with_more_comparisons():
    few = fit_bradley_terry(simulate(random.Random(3), 100))
    many = fit_bradley_terry(simulate(random.Random(3), 1600))
    for name in TRUE:
        assert many[name].stderr < few[name].stderr / 2.5
        assert many[name].low < many[name].strength < many[name].high


def test_ties_count_half_a_win_each_way():
    outcomes = outcomes_from_choices([("x", "y", "tie", 10), ("x", "y", "both_bad", 2)])
    assert outcomes == [("x", "y", 5.0), ("y", "x", 5.0), ("x", "y", 1.0), ("y", "x", 1.0)]
    fit = fit_bradley_terry(outcomes)
    assert fit["x"].strength == pytest.approx(0, abs=1e-9) and fit["y"].strength == pytest.approx(0, abs=1e-9)
    assert (fit["x"].wins, fit["x"].games) == (6.0, 12.0)
    # 3 wins and 2 ties against 1 win: like 4 wins to 2.
    with_ties = fit_bradley_terry(
        outcomes_from_choices([("a", "b", "a", 3), ("a", "b", "tie", 2), ("a", "b", "b", 1)])
    )
    plain = fit_bradley_terry([("a", "b", 4.0), ("b", "a", 2.0)])
    assert with_ties["a"].strength == pytest.approx(plain["a"].strength)


def test_choices_name_the_winner_in_canonical_order():
    assert outcomes_from_choices([(1, 2, "a", 3), (1, 2, "b", 1)]) == [(1, 2, 3.0), (2, 1, 1.0)]
    assert outcomes_from_choices([(1, 1, "a", 3)]) == []  # a version against itself says nothing


def test_a_version_that_never_lost_gets_a_finite_strength_with_a_wide_interval():
    fit = fit_bradley_terry([("champion", "v1", 6.0), ("v1", "v0", 3.0), ("v0", "v1", 3.0)])
    champion = fit["champion"]
    assert math.isfinite(champion.strength) and champion.strength > fit["v1"].strength
    assert champion.high - champion.low > 2


def test_versions_without_comparisons_are_not_fitted():
    fit = fit_bradley_terry(outcomes_from_choices([("a", "b", "a", 2), ("a", "b", "b", 1)]))
    assert set(fit) == {"a", "b"}  # the view shows every other version as "no comparisons"
    assert fit_bradley_terry([]) == {}


def test_a_lopsided_record_still_converges():
    fit = fit_bradley_terry([("a", "b", 500.0), ("b", "a", 1.0), ("b", "c", 500.0), ("c", "b", 1.0)])
    assert fit["a"].strength > fit["b"].strength > fit["c"].strength
    assert all(math.isfinite(s.stderr) for s in fit.values())


@pytest.mark.parametrize(
    ("outcomes", "message"),
    [
        ([("a", "a", 1.0)], "cannot beat itself"),
        ([("a", "b", -1.0)], "weight"),
        ([("a", "b", math.nan)], "weight"),
    ],
)
def test_it_rejects_bad_outcomes(outcomes, message):
    with pytest.raises(ValueError, match=message):
        fit_bradley_terry(outcomes)


def test_it_rejects_an_unknown_choice_and_a_prior_that_identifies_nothing():
    with pytest.raises(ValueError, match="choice"):
        outcomes_from_choices([("a", "b", "skip", 1)])
    with pytest.raises(ValueError, match="prior"):
        fit_bradley_terry([("a", "b", 1.0)], prior=0)
