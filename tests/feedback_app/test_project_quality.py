"""project_quality reads a project's current labels and reports agreement, time per label and gold accuracy."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import timedelta
from itertools import combinations

import pytest
from django.utils import timezone

from feedback_app.agreement import (
    fleiss_kappa,
    krippendorff_alpha_nominal,
    majority_agreement,
    median,
    pairwise_kappas,
    project_quality,
)
from feedback_app.gold import annotator_gold_accuracy
from feedback_app.models import Assignment, Comparison, LabelKind, QueueItem, StepLabel
from tests.feedback_app.labels import gold_comparison_item, stored_comparison

pytestmark = pytest.mark.django_db


@pytest.fixture
def third_annotator(django_user_model, project):
    from feedback_app.models import Membership

    user = django_user_model.objects.create_user(username="annotator3", password="pw")
    Membership.objects.create(user=user, project=project, role="annotator")
    return user


_compare = stored_comparison


def _label_steps(project, user, trajectory, values, assignment=None):
    steps = {step.index: step for step in trajectory.steps.all()}
    return [
        StepLabel.objects.create(project=project, annotator=user, step=steps[i], value=v, assignment=assignment)
        for i, v in values.items()
    ]


def _assignment(item, user, slot=0, status="done"):
    return Assignment.objects.create(
        item=item, annotator=user, slot=slot, status=status, leased_until=timezone.now() + timedelta(minutes=5)
    )


@pytest.fixture
def five_pairs(make_trajectory):
    return [(make_trajectory(), make_trajectory()) for _ in range(5)]


def test_comparison_agreement_matches_the_hand_computed_figures(project, annotator, other_annotator, five_pairs):
    # annotator:  a a b b tie   (the fourth first labelled "a", then revised to "b": only the revision counts)
    # annotator2: a a b a tie
    # Cohen: p_o = 0.8, p_e = (2*3 + 2*1 + 1*1) / 25 = 0.36, kappa = 0.44 / 0.64 = 0.6875.
    # Fleiss (two raters, Scott's pi): shares a 5/10, b 3/10, tie 2/10, P_e = 0.38, kappa = 0.42 / 0.62.
    # Krippendorff: n = 10, one disagreeing unit gives o_ab = o_ba = 1, alpha = 1 - 9 * 2 / (100 - 38) = 0.7097.
    mine = ["a", "a", "b", "a", "tie"]
    theirs = ["b", "b", "a", "b", "tie"]  # given as (b, a): stored canonically, the same answers as "a a b a tie"
    seconds = [10.0, 20.0, 30.0, 40.0, None]
    for (a, b), choice, spent in zip(five_pairs, mine, seconds, strict=True):
        _compare(project, annotator, a, b, choice, seconds=spent)
    for (a, b), choice in zip(five_pairs, theirs, strict=True):
        _compare(project, other_annotator, b, a, choice)
    fourth = Comparison.objects.get(annotator=annotator, trajectory_a=min(five_pairs[3], key=lambda t: t.pk))
    fourth.revise(choice="b", seconds_spent=45.0)  # the revision's time replaces the 40 s of the first answer

    quality = project_quality(project, min_shared=5).kind(LabelKind.COMPARISON)

    assert (quality.labels, quality.units, quality.units_with_overlap) == (10, 5, 5)
    assert quality.fleiss_kappa == pytest.approx(0.42 / 0.62)
    assert quality.krippendorff_alpha == pytest.approx(1 - 9 * 2 / 62)
    [pair] = quality.pairs
    assert (pair.rater_a, pair.rater_b, pair.shared) == ("annotator", "annotator2", 5)
    assert pair.kappa == pytest.approx(0.6875)
    mine_row, theirs_row = quality.annotators
    assert mine_row.username == "annotator" and mine_row.labels == 5
    assert (mine_row.majority.agreed, mine_row.majority.compared) == (4, 5)
    assert mine_row.median_seconds == 25.0  # of 10, 20, 30, 45
    assert theirs_row.median_seconds is None


def test_pairs_below_the_shared_threshold_are_not_reported(project, annotator, other_annotator, five_pairs):
    for a, b in five_pairs[:3]:
        _compare(project, annotator, a, b, "a")
        _compare(project, other_annotator, a, b, "b")
    assert project_quality(project, min_shared=5).kind(LabelKind.COMPARISON).pairs == []
    [pair] = project_quality(project, min_shared=3).kind(LabelKind.COMPARISON).pairs
    assert pair.shared == 3
    assert pair.kappa == pytest.approx(0.0)  # each always picks one side: p_o = 0 = p_e


def test_step_label_agreement_uses_the_step_as_unit(
    project, annotator, other_annotator, third_annotator, make_trajectory
):
    trajectory = make_trajectory(n_steps=4)
    _label_steps(project, annotator, trajectory, {0: 1, 1: 1, 2: -1, 3: 0})
    _label_steps(project, other_annotator, trajectory, {0: 1, 1: 1, 2: -1, 3: -1})
    _label_steps(project, third_annotator, trajectory, {0: 1, 1: 0, 2: -1})

    quality = project_quality(project, min_shared=3).kind(LabelKind.STEP_LABEL)

    assert (quality.labels, quality.units, quality.units_with_overlap) == (11, 4, 4)
    # By hand: n = 11 values (+1: 5, 0: 2, -1: 4); disagreeing coincidences: step 1 (1, 1, 0) gives 1 + 1, step 3
    # (0, -1) gives 1 + 1. alpha = 1 - 10 * 4 / (121 - 45) = 0.47368.
    assert quality.krippendorff_alpha == pytest.approx(1 - 40 / 76)
    # Fleiss, raters per step 3, 3, 3, 2: P_i = 1, 1/3, 1, 0; P_e = 45 / 121.
    p_bar, p_e = (1 + 1 / 3 + 1 + 0) / 4, 45 / 121
    assert quality.fleiss_kappa == pytest.approx((p_bar - p_e) / (1 - p_e))
    majority = {row.username: (row.majority.agreed, row.majority.compared) for row in quality.annotators}
    # annotator3: steps 0 and 2 with the others, step 1 against them -> 2 of 3. annotator: step 1's others tie
    # (1 and 0), so it is skipped; step 3 against annotator2 -> 2 of 3.
    assert majority == {"annotator": (2, 3), "annotator2": (2, 3), "annotator3": (2, 3)}
    assert [(p.rater_a, p.rater_b, p.shared) for p in quality.pairs] == [
        ("annotator", "annotator2", 4),
        ("annotator", "annotator3", 3),
        ("annotator2", "annotator3", 3),
    ]


def test_gold_accuracy_counts_handed_in_answers_to_gold_items(project, annotator, other_annotator, make_trajectory):
    a, b = make_trajectory(), make_trajectory()
    gold_pair = gold_comparison_item(project, a, b, "a", overlap=2)
    _compare(project, annotator, a, b, "a", assignment=_assignment(gold_pair, annotator, 0))
    _compare(project, other_annotator, a, b, "b", assignment=_assignment(gold_pair, other_annotator, 1))
    stepped = make_trajectory(n_steps=4)
    gold_steps = QueueItem.objects.create(
        project=project, kind=LabelKind.STEP_LABEL, trajectory=stepped, overlap=2, is_gold=True,
        gold_answer={"first_error": 2},
    )  # fmt: skip
    _label_steps(project, annotator, stepped, {0: 1, 1: 1, 2: -1}, _assignment(gold_steps, annotator, 0))
    _label_steps(project, other_annotator, stepped, {0: 1, 1: -1}, _assignment(gold_steps, other_annotator, 1))
    # Not counted: a plain item, and a gold item whose assignment is not handed in yet.
    c, d = make_trajectory(), make_trajectory()
    plain = QueueItem.objects.create(project=project, kind=LabelKind.COMPARISON, trajectory=c, other_trajectory=d)
    _compare(project, other_annotator, c, d, "b", assignment=_assignment(plain, other_annotator))
    unfinished = make_trajectory(n_steps=3)
    open_gold = QueueItem.objects.create(
        project=project, kind=LabelKind.STEP_LABEL, trajectory=unfinished, is_gold=True,
        gold_answer={"first_error": None},
    )  # fmt: skip
    _label_steps(project, annotator, unfinished, {0: -1}, _assignment(open_gold, annotator, status="leased"))

    quality = project_quality(project)

    def gold_of(kind):
        return {row.username: (row.gold.correct, row.gold.total) for row in quality.kind(kind).annotators}

    assert gold_of(LabelKind.COMPARISON) == {"annotator": (1, 1), "annotator2": (0, 1)}
    assert gold_of(LabelKind.STEP_LABEL) == {"annotator": (1, 1), "annotator2": (0, 1)}
    overall = {row.username: (row.gold.correct, row.gold.total, row.gold.accuracy) for row in quality.annotators}
    assert overall == {"annotator": (2, 2, 1.0), "annotator2": (0, 2, 0.0)}
    by_id = annotator_gold_accuracy(project)
    assert (by_id[annotator.pk].correct, by_id[annotator.pk].total) == (2, 2)
    assert (by_id[other_annotator.pk].correct, by_id[other_annotator.pk].total) == (0, 2)


def test_an_empty_project_has_no_figures_and_does_not_crash(project):
    quality = project_quality(project)
    for kind in quality.kinds:
        assert (kind.labels, kind.units, kind.fleiss_kappa, kind.krippendorff_alpha) == (0, 0, None, None)
        assert kind.pairs == [] and kind.annotators == []
    assert quality.annotators == []


def test_one_category_everywhere_gives_undefined_kappa_not_a_crash(project, annotator, other_annotator, five_pairs):
    for a, b in five_pairs:
        _compare(project, annotator, a, b, "a")
        _compare(project, other_annotator, a, b, "a")
    quality = project_quality(project).kind(LabelKind.COMPARISON)
    assert quality.fleiss_kappa is None and quality.krippendorff_alpha is None
    assert quality.pairs[0].kappa is None
    assert quality.annotators[0].majority.rate == 1.0


def test_labels_of_other_projects_are_left_out(project, annotator, gridworld_spec, five_pairs):
    from feedback_app.models import Project, Task, Trajectory

    other = Project.objects.create(name="Other", environment=gridworld_spec)
    task = Task.objects.create(project=other, instruction="x")
    x, y = (Trajectory.objects.create(project=other, task=task, source="human") for _ in range(2))
    _compare(other, annotator, x, y, "a")
    assert project_quality(project).kind(LabelKind.COMPARISON).labels == 0


def test_it_reads_the_project_in_a_constant_number_of_queries(
    project, annotator, other_annotator, make_trajectory, django_assert_max_num_queries
):
    def add_labels(n):
        for _ in range(n):
            a, b = make_trajectory(n_steps=3), make_trajectory(n_steps=3)
            item = gold_comparison_item(project, a, b, "a", overlap=2)
            for slot, (user, choice) in enumerate(((annotator, "a"), (other_annotator, "b"))):
                _compare(project, user, a, b, choice, assignment=_assignment(item, user, slot))
                _label_steps(project, user, a, {0: 1, 1: -1})

    add_labels(2)
    with django_assert_max_num_queries(8):
        project_quality(project)
    add_labels(10)
    with django_assert_max_num_queries(8):
        quality = project_quality(project)
    assert quality.kind(LabelKind.COMPARISON).labels == 24


def test_the_databases_counts_give_the_textbook_figures_on_random_labels(project, django_user_model, make_trajectory):
    """project_quality counts in SQL; the plain functions above it are the reference. Random units with one to five
    raters and two to four categories in play make every case of the leave-one-out majority (clear, two-way and
    three-way ties) and units no one else labelled."""
    rng = random.Random(11)
    raters = [django_user_model.objects.create_user(username=f"rater{i}", password="pw") for i in range(5)]
    trajectories = [make_trajectory(n_steps=4) for _ in range(9)]
    comparisons, step_labels = [], []
    for a, b in list(combinations(trajectories, 2))[:30]:
        choices = ["a", "b", "tie", "both_bad"][: rng.randint(2, 4)]
        for rater in rng.sample(raters, rng.randint(1, 5)):
            seconds = rng.choice([None, round(rng.uniform(1, 60), 1)])
            choice = rng.choice(choices)
            comparisons.append(
                Comparison(project=project, annotator=rater, trajectory_a=a, trajectory_b=b, choice=choice,
                           seconds_spent=seconds)
            )  # fmt: skip
    for trajectory in trajectories:
        for step in trajectory.steps.all():
            for rater in rng.sample(raters, rng.randint(1, 5)):
                value = rng.choice((-1, 0, 1))
                step_labels.append(
                    StepLabel(project=project, annotator=rater, step=step, value=value, seconds_spent=3.0)
                )
    Comparison.objects.bulk_create(comparisons)
    StepLabel.objects.bulk_create(step_labels)

    quality = project_quality(project, min_shared=3)
    names = {rater.pk: rater.username for rater in raters}
    for kind, labels in (
        (LabelKind.COMPARISON, [((c.trajectory_a_id, c.trajectory_b_id), c.annotator_id, c.choice, c.seconds_spent)
                                for c in comparisons]),
        (LabelKind.STEP_LABEL, [(s.step_id, s.annotator_id, s.value, s.seconds_spent) for s in step_labels]),
    ):  # fmt: skip
        by_unit: defaultdict = defaultdict(dict)
        seconds: defaultdict = defaultdict(list)
        for unit, rater, category, spent in labels:
            by_unit[unit][rater] = category
            seconds[rater].append(spent)
        overlapping = [by_rater for by_rater in by_unit.values() if len(by_rater) >= 2]
        figures = quality.kind(kind)
        assert (figures.labels, figures.units, figures.units_with_overlap) == (
            len(labels),
            len(by_unit),
            len(overlapping),
        )
        assert figures.fleiss_kappa == pytest.approx(fleiss_kappa(Counter(r.values()) for r in overlapping))
        assert figures.krippendorff_alpha == pytest.approx(krippendorff_alpha_nominal(r.values() for r in overlapping))
        majority = majority_agreement(by_unit)
        assert {row.annotator_id: (row.majority, row.labels) for row in figures.annotators} == {
            rater: (majority[rater], len(seconds[rater])) for rater in seconds
        }
        assert {row.annotator_id: row.median_seconds for row in figures.annotators} == pytest.approx(
            {rater: median(spent) for rater, spent in seconds.items()}
        )
        expected_pairs = {
            tuple(sorted((names[pair.rater_a], names[pair.rater_b]))): pair
            for pair in pairwise_kappas(by_unit, min_shared=3)
        }
        assert [(pair.rater_a, pair.rater_b) for pair in figures.pairs] == sorted(expected_pairs)
        for pair in figures.pairs:
            expected = expected_pairs[pair.rater_a, pair.rater_b]
            assert (pair.shared, pair.kappa) == (expected.shared, pytest.approx(expected.kappa))
        assert len(expected_pairs) >= 5  # enough rater pairs share three units for the comparison to mean something
    majorities = [row.majority for kind in quality.kinds for row in kind.annotators]
    assert all(0 < m.agreed < m.compared for m in majorities)  # both outcomes occur for every rater
