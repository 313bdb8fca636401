"""How much annotators agree, and how good each one is: the figures on a researcher's project page.

The first half is plain arithmetic on labels (no Django), checked in tests against textbook examples:

- ``cohen_kappa``: two raters, the units both labelled.
- ``fleiss_kappa``: many raters; each unit given as counts per category. Units may have different numbers of raters
  (the usual generalisation: each unit's agreement is taken over its own raters, category shares over all labels).
- ``krippendorff_alpha_nominal``: many raters, missing labels allowed, from the coincidence matrix.
- ``majority_agreement``: how often each rater matches the majority of the *other* raters of a unit.

Each coefficient returns None where it is undefined rather than dividing by zero: fewer than two raters on every
unit, or every label in one category (chance agreement is then 1, and agreement beyond chance means nothing).

The second half, ``project_quality``, reads a project's current labels in a constant number of queries and reports
the figures per kind of label: comparisons (the unit is the canonical pair of trajectories, the category the choice)
and step labels (the unit is the step, the category the +1 / 0 / -1 value).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

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
    pairs = list(pairs)
    n = len(pairs)
    if n == 0:
        return None
    observed = sum(first == second for first, second in pairs) / n
    first_counts = Counter(first for first, _ in pairs)
    second_counts = Counter(second for _, second in pairs)
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
    unit_agreements = []
    for row in rows:
        raters = sum(row.values())
        totals.update(row)
        unit_agreements.append((sum(c * c for c in row.values()) - raters) / (raters * (raters - 1)))
    all_labels = sum(totals.values())
    chance = sum((count / all_labels) ** 2 for count in totals.values())
    if chance == 1:
        return None
    observed = sum(unit_agreements) / len(unit_agreements)
    return (observed - chance) / (1 - chance)


def krippendorff_alpha_nominal(units: Iterable[Iterable[Category]]) -> float | None:
    """Krippendorff's alpha for nominal data. Each unit is the list of labels it received (missing ones simply
    absent, so units may have any number of raters); units with a single label cannot be paired and are left out.

    alpha = 1 - (n - 1) * disagreeing pairable values / sum over category pairs c != k of n_c * n_k, where n is the
    number of pairable values and n_c the coincidences of category c.

    >>> krippendorff_alpha_nominal([["a", "a"], ["b", "b"], ["a", "b", "b"]])
    0.5
    """
    coincidences: Counter = Counter()  # (c, k) -> o_ck
    for unit in units:
        values = list(unit)
        m = len(values)
        if m < 2:
            continue
        counts = Counter(values)
        for c, n_c in counts.items():
            for k, n_k in counts.items():
                pairs = n_c * (n_k - 1) if c == k else n_c * n_k
                coincidences[c, k] += pairs / (m - 1)
    if not coincidences:
        return None
    marginals: Counter = Counter()
    for (c, _), o in coincidences.items():
        marginals[c] += o
    n = sum(marginals.values())
    expected = n * n - sum(n_c * n_c for n_c in marginals.values())
    if expected == 0:
        return None
    disagreeing = sum(o for (c, k), o in coincidences.items() if c != k)
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
    """Agreement, time per label and gold accuracy for `project`, from current labels only. Four queries."""
    label_fields = ("annotator_id", "annotator__username", "seconds_spent")
    comparisons = list(
        Comparison.objects.filter(project=project, is_current=True)
        .order_by()
        .values_list("trajectory_a_id", "trajectory_b_id", "choice", *label_fields)
    )
    step_labels = list(
        StepLabel.objects.filter(project=project, is_current=True)
        .order_by()
        .values_list("step_id", "value", *label_fields)
    )
    gold_answers = gold_answers_given(project)
    kinds = [
        _kind_quality(
            LabelKind.COMPARISON,
            "Comparisons",
            [((a, b), choice, *rest) for a, b, choice, *rest in comparisons],
            [answer for answer in gold_answers if answer[1] == LabelKind.COMPARISON],
            min_shared,
        ),
        _kind_quality(
            LabelKind.STEP_LABEL,
            "Step labels",
            step_labels,
            [answer for answer in gold_answers if answer[1] == LabelKind.STEP_LABEL],
            min_shared,
        ),
    ]
    names = {annotator_id: username for *_, annotator_id, username, _ in (*comparisons, *step_labels)}
    label_counts = Counter(annotator_id for *_, annotator_id, _, _ in (*comparisons, *step_labels))
    overall_gold = score_gold(gold_answers)
    annotators = [
        AnnotatorSummary(annotator_id, names[annotator_id], label_counts[annotator_id], overall_gold[annotator_id])
        for annotator_id in sorted(names, key=names.get)
    ]
    return ProjectQuality(project_id=project.pk, min_shared=min_shared, kinds=kinds, annotators=annotators)


def _kind_quality(kind: str, title: str, rows: list[tuple], gold_answers: list[tuple], min_shared: int) -> KindQuality:
    """`rows` are ``(unit, category, annotator_id, username, seconds_spent)``, one per current label."""
    by_unit: defaultdict[Unit, dict[int, Category]] = defaultdict(dict)
    names: dict[int, str] = {}
    seconds: defaultdict[int, list[float | None]] = defaultdict(list)
    for unit, category, annotator_id, username, seconds_spent in rows:
        by_unit[unit][annotator_id] = category
        names[annotator_id] = username
        seconds[annotator_id].append(seconds_spent)
    overlapping = [by_rater for by_rater in by_unit.values() if len(by_rater) >= 2]
    majority = majority_agreement(by_unit)
    gold = score_gold(gold_answers)
    pairs = [
        PairKappa(*sorted((names[pair.rater_a], names[pair.rater_b])), pair.shared, pair.kappa)
        for pair in pairwise_kappas(by_unit, min_shared=min_shared)
    ]
    return KindQuality(
        kind=kind,
        title=title,
        labels=len(rows),
        units=len(by_unit),
        units_with_overlap=len(overlapping),
        fleiss_kappa=fleiss_kappa(Counter(by_rater.values()) for by_rater in overlapping),
        krippendorff_alpha=krippendorff_alpha_nominal(by_rater.values() for by_rater in overlapping),
        pairs=sorted(pairs, key=lambda pair: (pair.rater_a, pair.rater_b)),
        annotators=[
            AnnotatorQuality(
                annotator_id=annotator_id,
                username=names[annotator_id],
                labels=len(seconds[annotator_id]),
                majority=majority[annotator_id],
                median_seconds=median(seconds[annotator_id]),
                gold=gold[annotator_id],
            )
            for annotator_id in sorted(names, key=names.get)
        ],
    )
