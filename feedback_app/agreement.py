"""How much annotators agree, and how good each one is: the figures on a researcher's project page.

The first half is plain arithmetic on labels (no Django), checked in tests against textbook examples:

- ``cohen_kappa``: two raters, the units both labelled.
- ``fleiss_kappa``: many raters; each unit given as counts per category. Units may have different numbers of raters
  (the usual generalisation: each unit's agreement is taken over its own raters, category shares over all labels).
- ``krippendorff_alpha_nominal``: many raters, missing labels allowed, from the coincidence matrix.
- ``majority_agreement``: how often each rater matches the majority of the *other* raters of a unit.

Each coefficient returns None where it is undefined rather than dividing by zero: fewer than two raters on every
unit, or every label in one category (chance agreement is then 1, and agreement beyond chance means nothing).

The second half, ``project_quality``, reports the figures per kind of label of a project's current labels:
comparisons (the unit is the canonical pair of trajectories, the category the choice) and step labels (the unit is
the step, the category the +1 / 0 / -1 value). The database counts labels per unit and category, and the sums go
through the same formulas (``fleiss_kappa_of_sums`` and the like); the per-unit functions of the first half are the
reference its tests hold it to.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from django.contrib.auth import get_user_model
from django.db import connection

from feedback_app.gold import GoldScore, gold_answers_given, score_gold
from feedback_app.models import Comparison, LabelKind, Project, StepLabel

Category = Hashable
Rater = Hashable
Unit = Hashable


@dataclass(frozen=True)
class Agreement:
    agreed: int
    compared: int

    @property
    def rate(self) -> float | None:
        return self.agreed / self.compared if self.compared else None


@dataclass(frozen=True)
class PairKappa:
    rater_a: Rater
    rater_b: Rater
    shared: int
    kappa: float | None


def cohen_kappa(pairs: Iterable[tuple[Category, Category]]) -> float | None:
    """Cohen's kappa of two raters from their labels of the same units, one ``(rater_1, rater_2)`` pair per unit.

    >>> cohen_kappa([("yes", "yes"), ("no", "no"), ("yes", "no"), ("no", "no")])
    0.5
    """
    return cohen_kappa_of_table(Counter(pairs))


def cohen_kappa_of_table(table: Mapping[tuple[Category, Category], int]) -> float | None:
    """Cohen's kappa from how many units got each ``(rater_1's label, rater_2's label)``."""
    n = sum(table.values())
    if n == 0:
        return None
    observed = sum(count for (first, second), count in table.items() if first == second) / n
    first_counts: Counter = Counter()
    second_counts: Counter = Counter()
    for (first, second), count in table.items():
        first_counts[first] += count
        second_counts[second] += count
    chance = sum(first_counts[c] * second_counts[c] for c in first_counts) / (n * n)
    if chance == 1:
        return None
    return (observed - chance) / (1 - chance)


def fleiss_kappa(item_counts: Iterable[Mapping[Category, int] | Sequence[int]]) -> float | None:
    """Fleiss' kappa from, per unit, how many raters chose each category (a mapping, or a row of counts in a fixed
    category order). Units with fewer than two raters carry no agreement and are left out.

    >>> round(fleiss_kappa([{"a": 2}, {"b": 2}, {"a": 1, "b": 1}]), 4)
    0.3333
    """
    rows = [dict(counts) if isinstance(counts, Mapping) else dict(enumerate(counts)) for counts in item_counts]
    rows = [row for row in rows if sum(row.values()) >= 2]
    if not rows:
        return None
    totals: Counter = Counter()
    agreement_sum = 0.0
    for row in rows:
        raters = sum(row.values())
        totals.update(row)
        agreement_sum += (sum(c * c for c in row.values()) - raters) / (raters * (raters - 1))
    return fleiss_kappa_of_sums(agreement_sum, len(rows), totals)


def fleiss_kappa_of_sums(agreement_sum: float, units: int, totals: Mapping[Category, int]) -> float | None:
    """Fleiss' kappa from its sums over the units with two raters or more: of each unit's agreement
    ``(sum_j n_ij^2 - n_i) / (n_i (n_i - 1))``, how many such units, and the labels per category in them."""
    all_labels = sum(totals.values())
    if units == 0 or all_labels == 0:
        return None
    chance = sum((count / all_labels) ** 2 for count in totals.values())
    if chance == 1:
        return None
    return (agreement_sum / units - chance) / (1 - chance)


def krippendorff_alpha_nominal(units: Iterable[Iterable[Category]]) -> float | None:
    """Krippendorff's alpha for nominal data. Each unit is the list of labels it received (missing ones simply
    absent, so units may have any number of raters); units with a single label cannot be paired and are left out.

    alpha = 1 - (n - 1) * disagreeing pairable values / sum over category pairs c != k of n_c * n_k, where n is the
    number of pairable values and n_c the coincidences of category c.

    >>> krippendorff_alpha_nominal([["a", "a"], ["b", "b"], ["a", "b", "b"]])
    0.5
    """
    # For nominal data the coincidences need not be listed: a unit of m values, n_c of them in category c, adds
    # (m^2 - sum_c n_c^2) / (m - 1) disagreeing pairable values, and its n_c to category c's marginal.
    disagreeing = 0.0
    marginals: Counter = Counter()
    for unit in units:
        counts = Counter(unit)
        m = sum(counts.values())
        if m < 2:
            continue
        disagreeing += (m * m - sum(n_c * n_c for n_c in counts.values())) / (m - 1)
        marginals.update(counts)
    return krippendorff_alpha_of_sums(disagreeing, marginals)


def krippendorff_alpha_of_sums(disagreeing: float, marginals: Mapping[Category, int]) -> float | None:
    """Nominal alpha from the disagreeing pairable values and each category's count among pairable values."""
    n = sum(marginals.values())
    expected = n * n - sum(n_c * n_c for n_c in marginals.values())
    if n == 0 or expected == 0:
        return None
    return 1 - (n - 1) * disagreeing / expected


def majority_agreement(labels: Mapping[Unit, Mapping[Rater, Category]]) -> dict[Rater, Agreement]:
    """For each rater, how often their label matches the majority of the other raters of the same unit.

    Leave-one-out: the rater's own label never counts towards the majority it is compared with. A unit counts for a
    rater only when it has at least one other rater and their labels have a single most common category (a tie
    among the others is no majority).

    >>> majority_agreement({1: {"ann": "a", "bob": "a", "cy": "b"}})["cy"]
    Agreement(agreed=0, compared=1)
    """
    agreed: Counter = Counter()
    compared: Counter = Counter()
    for by_rater in labels.values():
        for rater, label in by_rater.items():
            others = Counter(other_label for other, other_label in by_rater.items() if other != rater)
            top = others.most_common(2)
            if not top or (len(top) == 2 and top[0][1] == top[1][1]):
                continue
            compared[rater] += 1
            agreed[rater] += label == top[0][0]
    raters = {rater for by_rater in labels.values() for rater in by_rater}
    return {rater: Agreement(agreed[rater], compared[rater]) for rater in raters}


def pairwise_kappas(labels: Mapping[Unit, Mapping[Rater, Category]], *, min_shared: int = 5) -> list[PairKappa]:
    """Cohen's kappa for every pair of raters who labelled at least ``min_shared`` units in common."""
    shared: defaultdict[tuple[Rater, Rater], list[tuple[Category, Category]]] = defaultdict(list)
    for by_rater in labels.values():
        for first, second in combinations(sorted(by_rater, key=str), 2):
            shared[first, second].append((by_rater[first], by_rater[second]))
    return [
        PairKappa(first, second, len(pairs), cohen_kappa(pairs))
        for (first, second), pairs in sorted(shared.items(), key=lambda entry: (str(entry[0][0]), str(entry[0][1])))
        if len(pairs) >= min_shared
    ]


def median(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


# The project's figures ------------------------------------------------------------------------------------------


@dataclass
class AnnotatorQuality:
    annotator_id: int
    username: str
    labels: int
    majority: Agreement
    median_seconds: float | None
    gold: GoldScore


@dataclass
class KindQuality:
    kind: str
    title: str
    labels: int
    units: int
    units_with_overlap: int  # units with two raters or more: the ones agreement rests on
    fleiss_kappa: float | None
    krippendorff_alpha: float | None
    pairs: list[PairKappa]  # rater_a / rater_b are usernames
    annotators: list[AnnotatorQuality]


@dataclass
class AnnotatorSummary:
    annotator_id: int
    username: str
    labels: int
    gold: GoldScore


@dataclass
class ProjectQuality:
    project_id: int
    min_shared: int
    kinds: list[KindQuality] = field(default_factory=list)
    annotators: list[AnnotatorSummary] = field(default_factory=list)

    def kind(self, kind: str) -> KindQuality:
        return next(entry for entry in self.kinds if entry.kind == kind)


def project_quality(project: Project, *, min_shared: int = 5) -> ProjectQuality:
    """Agreement, time per label and gold accuracy for `project`, from current labels only, in eight queries.

    The database does the counting (`_unit_sums`, `_rater_rows`, `_rater_pair_tables`), so a project of a million
    labels costs the web process a few thousand rows, not a million; the formulas are the ones above."""
    user_table = get_user_model()._meta.db_table
    gold_answers = gold_answers_given(project)
    figures = [
        kind.build(project.pk, user_table, min_shared, [answer for answer in gold_answers if answer[1] == kind.kind])
        for kind in (COMPARISONS, STEP_LABELS)
    ]
    names: dict[int, str] = {}
    label_counts: Counter = Counter()
    for figure in figures:
        for row in figure.annotators:
            names[row.annotator_id] = row.username
            label_counts[row.annotator_id] += row.labels
    overall_gold = score_gold(gold_answers)
    annotators = [
        AnnotatorSummary(annotator_id, names[annotator_id], label_counts[annotator_id], overall_gold[annotator_id])
        for annotator_id in sorted(names, key=names.get)
    ]
    return ProjectQuality(project_id=project.pk, min_shared=min_shared, kinds=figures, annotators=annotators)


@dataclass(frozen=True)
class KindReader:
    """How one kind of label is read: its model, the columns that name its unit (two; a constant fills in for a
    one-column unit) and the column that holds its category."""

    kind: str
    title: str
    model: type
    unit: tuple[str, str]
    category: str

    def labels_sql(self) -> str:
        table = self.model._meta.db_table
        return (
            f"labels AS (SELECT {self.unit[0]} AS u1, {self.unit[1]} AS u2, {self.category} AS category, "
            f"annotator_id AS rater, seconds_spent AS seconds FROM {table} WHERE project_id = %s AND is_current), "
            "cells AS (SELECT u1, u2, category, COUNT(*) AS n FROM labels GROUP BY u1, u2, category)"
        )

    def build(self, project_id: int, user_table: str, min_shared: int, gold_answers: list[tuple]) -> KindQuality:
        units, overlapping, labels, agreement_sum, disagreeing, totals = self._unit_sums(project_id)
        gold = score_gold(gold_answers)
        raters = self._rater_rows(project_id, user_table)
        names = {row[0]: row[1] for row in raters}
        pairs = [
            PairKappa(*sorted((names[first], names[second])), sum(table.values()), cohen_kappa_of_table(table))
            for (first, second), table in self._rater_pair_tables(project_id).items()
            if sum(table.values()) >= min_shared
        ]
        return KindQuality(
            kind=self.kind,
            title=self.title,
            labels=labels,
            units=units,
            units_with_overlap=overlapping,
            fleiss_kappa=fleiss_kappa_of_sums(agreement_sum, overlapping, totals),
            krippendorff_alpha=krippendorff_alpha_of_sums(disagreeing, totals),
            pairs=sorted(pairs, key=lambda pair: (pair.rater_a, pair.rater_b)),
            annotators=[
                AnnotatorQuality(
                    annotator_id=rater,
                    username=username,
                    labels=count,
                    majority=Agreement(agreed, compared),
                    median_seconds=median_seconds,
                    gold=gold[rater],
                )
                for rater, username, count, compared, agreed, median_seconds in sorted(raters, key=lambda row: row[1])
            ],
        )

    def _unit_sums(self, project_id: int) -> tuple[int, int, int, float, float, dict]:
        """Units, units with two raters or more, labels, the sum of those units' Fleiss agreement and of their
        disagreeing pairable values (Krippendorff), and labels per category within them."""
        sql = f"""
            WITH {self.labels_sql()},
            units AS (SELECT u1, u2, SUM(n) AS m, SUM(n * n) AS sq FROM cells GROUP BY u1, u2)
            SELECT 0, NULL, COUNT(*), SUM(CASE WHEN m >= 2 THEN 1 ELSE 0 END), SUM(m),
                   SUM(CASE WHEN m >= 2 THEN (sq - m) * 1.0 / (m * (m - 1)) ELSE 0 END),
                   SUM(CASE WHEN m >= 2 THEN (m * m - sq) * 1.0 / (m - 1) ELSE 0 END)
            FROM units
            UNION ALL
            SELECT 1, cells.category, SUM(cells.n), NULL, NULL, NULL, NULL
            FROM cells JOIN units ON units.u1 = cells.u1 AND units.u2 = cells.u2
            WHERE units.m >= 2 GROUP BY cells.category
            ORDER BY 1
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, [project_id])
            (_, _, units, overlapping, labels, agreement_sum, disagreeing), *categories = cursor.fetchall()
        totals = {category: int(count) for _, category, count, *_ in categories}
        sums = (float(agreement_sum or 0), float(disagreeing or 0))
        return int(units), int(overlapping or 0), int(labels or 0), *sums, totals

    def _rater_rows(self, project_id: int, user_table: str) -> list[tuple]:
        """Per annotator: id, username, labels, units compared with the others' majority and agreed with it (see
        `majority_agreement`), and the median of the seconds spent (None when none were recorded)."""
        # A unit's cells ranked: its largest count, how many categories have it, and the largest count below it.
        # Against the others' majority a label of category c (n_c labels in its unit) is: agreed when c alone is
        # top and n_c - 1 still beats the runner-up; compared but not agreed when another category is the others'
        # single top (c is one of exactly two tops, or c is below a single top); otherwise there is no majority.
        sql = f"""
            WITH {self.labels_sql()},
            topped AS (SELECT *, MAX(n) OVER (PARTITION BY u1, u2) AS top FROM cells),
            ranked AS (
                SELECT u1, u2, category, n, top,
                       SUM(CASE WHEN n = top THEN 1 ELSE 0 END) OVER (PARTITION BY u1, u2) AS at_top,
                       MAX(CASE WHEN n < top THEN n ELSE 0 END) OVER (PARTITION BY u1, u2) AS runner_up
                FROM topped
            ),
            judged AS (
                SELECT labels.rater,
                       CASE WHEN n = top AND at_top = 1 AND top - 1 > runner_up THEN 2
                            WHEN n = top AND at_top = 2 THEN 1
                            WHEN n < top AND at_top = 1 THEN 1
                            ELSE 0 END AS outcome
                FROM labels JOIN ranked
                  ON ranked.u1 = labels.u1 AND ranked.u2 = labels.u2 AND ranked.category = labels.category
            ),
            per_rater AS (
                SELECT rater, COUNT(*) AS labels, SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS compared,
                       SUM(CASE WHEN outcome = 2 THEN 1 ELSE 0 END) AS agreed
                FROM judged GROUP BY rater
            ),
            timed AS (
                SELECT rater, seconds, ROW_NUMBER() OVER (PARTITION BY rater ORDER BY seconds) AS place,
                       COUNT(*) OVER (PARTITION BY rater) AS timed_labels
                FROM labels WHERE seconds IS NOT NULL
            ),
            medians AS (
                SELECT rater, AVG(CAST(seconds AS DOUBLE PRECISION)) AS median FROM timed
                WHERE place IN ((timed_labels + 1) / 2, (timed_labels + 2) / 2) GROUP BY rater
            )
            SELECT per_rater.rater, users.username, per_rater.labels, per_rater.compared, per_rater.agreed,
                   medians.median
            FROM per_rater JOIN {user_table} AS users ON users.id = per_rater.rater
            LEFT JOIN medians ON medians.rater = per_rater.rater
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, [project_id])
            return [
                (rater, username, int(labels), int(compared), int(agreed), None if median is None else float(median))
                for rater, username, labels, compared, agreed, median in cursor.fetchall()
            ]

    def _rater_pair_tables(self, project_id: int) -> dict[tuple[int, int], dict[tuple, int]]:
        """For every two annotators who labelled a unit in common, how many shared units got each pair of labels."""
        sql = f"""
            WITH {self.labels_sql()}
            SELECT first.rater, second.rater, first.category, second.category, COUNT(*)
            FROM labels AS first JOIN labels AS second
              ON second.u1 = first.u1 AND second.u2 = first.u2 AND second.rater > first.rater
            GROUP BY first.rater, second.rater, first.category, second.category
        """
        tables: defaultdict[tuple[int, int], dict[tuple, int]] = defaultdict(dict)
        with connection.cursor() as cursor:
            cursor.execute(sql, [project_id])
            for first, second, first_label, second_label, count in cursor.fetchall():
                tables[first, second][first_label, second_label] = int(count)
        return tables


COMPARISONS = KindReader(
    LabelKind.COMPARISON, "Comparisons", Comparison, ("trajectory_a_id", "trajectory_b_id"), "choice"
)
STEP_LABELS = KindReader(LabelKind.STEP_LABEL, "Step labels", StepLabel, ("step_id", "0"), "value")
