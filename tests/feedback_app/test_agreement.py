"""The agreement coefficients against worked textbook examples, and their edge cases. Pure arithmetic, no database."""

from __future__ import annotations

import pytest

from feedback_app.agreement import (
    Agreement,
    cohen_kappa,
    fleiss_kappa,
    krippendorff_alpha_nominal,
    majority_agreement,
    median,
    pairwise_kappas,
)


def _pairs(yes_yes: int, yes_no: int, no_yes: int, no_no: int) -> list[tuple[str, str]]:
    return [("y", "y")] * yes_yes + [("y", "n")] * yes_no + [("n", "y")] * no_yes + [("n", "n")] * no_no


def _units(reliability_data: list[list]) -> list[list]:
    """Coder-by-unit rows with None for a missing value, turned into the labels each unit received."""
    return [[row[u] for row in reliability_data if row[u] is not None] for u in range(len(reliability_data[0]))]


def test_cohen_kappa_matches_the_wikipedia_worked_example():
    # Wikipedia, "Cohen's kappa", simple example: 50 proposals, 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no.
    # p_o = 0.7, p_e = 0.5, kappa = 0.4.
    assert cohen_kappa(_pairs(20, 5, 10, 15)) == pytest.approx(0.4)


def test_cohen_kappa_matches_the_wikipedia_same_percentage_examples():
    # Wikipedia, "Same percentages but different numbers": both tables agree on 60 %, kappa 0.1304 and 0.2593.
    assert cohen_kappa(_pairs(45, 15, 25, 15)) == pytest.approx(0.1304, abs=1e-4)
    assert cohen_kappa(_pairs(25, 35, 5, 35)) == pytest.approx(0.2593, abs=1e-4)


def test_cohen_kappa_is_one_for_perfect_agreement_and_negative_below_chance():
    assert cohen_kappa([("a", "a"), ("b", "b"), ("tie", "tie")]) == pytest.approx(1.0)
    assert cohen_kappa([("a", "b"), ("b", "a")]) == pytest.approx(-1.0)


def test_cohen_kappa_is_undefined_when_everything_is_one_category_or_there_is_nothing():
    assert cohen_kappa([("a", "a")] * 10) is None
    assert cohen_kappa([]) is None


def test_fleiss_kappa_matches_the_wikipedia_worked_example():
    # Wikipedia, "Fleiss' kappa", worked example: 10 subjects, 14 raters, 5 categories.
    # P-bar = 0.378, P-bar_e = 0.213, kappa = 0.210.
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(table) == pytest.approx(0.210, abs=5e-4)
    # The same table as category -> count mappings gives the same figure.
    as_mappings = [{f"c{j}": n for j, n in enumerate(row) if n} for row in table]
    assert fleiss_kappa(as_mappings) == pytest.approx(fleiss_kappa(table))


def test_fleiss_kappa_with_two_raters_per_unit_is_scotts_pi():
    # By hand for Cohen's 20/5/10/15 table: p_yes = (25 + 30) / 100 = 0.55, P_e = 0.55^2 + 0.45^2 = 0.505,
    # P_o = 0.7, pi = (0.7 - 0.505) / 0.495 = 0.3939...
    units = [{"y": 2}] * 20 + [{"y": 1, "n": 1}] * 15 + [{"n": 2}] * 15
    assert fleiss_kappa(units) == pytest.approx((0.7 - 0.505) / 0.495)


def test_fleiss_kappa_skips_single_rater_units_and_is_undefined_without_variation():
    assert fleiss_kappa([{"a": 1}, {"b": 1}]) is None  # fewer than two raters everywhere
    assert fleiss_kappa([{"a": 3}, {"a": 2}]) is None  # one category everywhere
    assert fleiss_kappa([]) is None
    assert fleiss_kappa([{"a": 2}, {"b": 2}, {"b": 1}]) == pytest.approx(1.0)


def test_krippendorff_alpha_matches_the_wikipedia_computational_example():
    # Wikipedia, "Krippendorff's alpha", a computational example: 3 coders, 15 units, missing values.
    # Nominal alpha = 0.691.
    data = [
        [None, None, None, None, None, 3, 4, 1, 2, 1, 1, 3, 3, None, 3],
        [1, None, 2, 1, 3, 3, 4, 3, None, None, None, None, None, None, None],
        [None, None, 2, 1, 3, 4, 4, None, 2, 1, 1, 3, 3, None, 4],
    ]
    assert krippendorff_alpha_nominal(_units(data)) == pytest.approx(0.691358, abs=1e-6)


def test_krippendorff_alpha_matches_krippendorffs_own_four_coder_example():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers, 12 units, some
    # missing; nominal alpha = 0.743.
    data = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    ]
    assert krippendorff_alpha_nominal(_units(data)) == pytest.approx(0.743, abs=5e-4)


def test_krippendorff_alpha_takes_any_hashable_category():
    data = [["pos", "neg", "neu", None], ["pos", "neg", "neu", "pos"], ["pos", "neg", "pos", "pos"]]
    # By hand: 11 pairable values (pos 6, neg 3, neu 2); only unit 3 (neu, neu, pos) disagrees, with coincidences
    # o(neu, pos) = o(pos, neu) = 1. alpha = 1 - (11 - 1) * 2 / (11^2 - (36 + 9 + 4)) = 1 - 20 / 72 = 0.7222.
    assert krippendorff_alpha_nominal(_units(data)) == pytest.approx(0.722222, abs=1e-6)


def test_krippendorff_alpha_edge_cases():
    assert krippendorff_alpha_nominal([["a", "a"], ["b", "b"]]) == pytest.approx(1.0)
    assert krippendorff_alpha_nominal([["a", "a"], ["a", "a", "a"]]) is None  # one category: undefined
    assert krippendorff_alpha_nominal([["a"], ["b"]]) is None  # nothing pairable
    assert krippendorff_alpha_nominal([]) is None


def test_majority_agreement_leaves_the_rater_out_and_skips_ties():
    labels = {
        "u1": {"ann": "a", "bob": "a", "cy": "b"},  # ann: others a,b tie -> skipped; bob likewise; cy: others a,a
        "u2": {"ann": "a", "bob": "a", "cy": "a"},  # everyone agrees with the others
        "u3": {"ann": "b"},  # alone: nothing to compare with
        "u4": {"ann": "tie", "bob": "a"},  # one other rater is the majority
    }
    result = majority_agreement(labels)
    assert result["ann"] == Agreement(agreed=1, compared=2)
    assert result["bob"] == Agreement(agreed=1, compared=2)
    assert result["cy"] == Agreement(agreed=1, compared=2)
    assert result["ann"].rate == 0.5
    assert Agreement(0, 0).rate is None


def test_pairwise_kappas_only_reports_pairs_with_enough_shared_units():
    labels = {unit: {"ann": "a" if unit % 2 else "b", "bob": "a" if unit % 2 else "b"} for unit in range(6)}
    labels.update({unit: {"ann": "a", "cy": "b"} for unit in range(100, 103)})
    pairs = pairwise_kappas(labels, min_shared=5)
    assert [(p.rater_a, p.rater_b, p.shared) for p in pairs] == [("ann", "bob", 6)]
    assert pairs[0].kappa == pytest.approx(1.0)
    assert [(p.rater_a, p.rater_b, p.shared) for p in pairwise_kappas(labels, min_shared=3)] == [
        ("ann", "bob", 6),
        ("ann", "cy", 3),
    ]


def test_median_ignores_missing_times():
    assert median([3.0, None, 1.0, 10.0]) == 3.0
    assert median([None]) is None
