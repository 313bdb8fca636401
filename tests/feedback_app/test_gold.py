"""Gold items: canonical answers, scoring, a researcher's gold, and gold made from the environment's oracle."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from feedback_app.gold import gold_answer_for_comparison, gold_correct, make_gold_items, set_gold
from feedback_app.models import Comparison, LabelKind, QueueItem, Step, StepLabel, Task, Trajectory
from reward_models.envs.gridworld import ACTIONS, GridWorld
from tests.trajectories import save_steps

pytestmark = pytest.mark.django_db


def _played(project, task, actions, **fields):
    fields.setdefault("source", "human")
    trajectory = Trajectory.objects.create(project=project, task=task, num_steps=len(actions), **fields)
    save_steps(trajectory, [Step(index=i, action=a) for i, a in enumerate(actions)])
    return trajectory


def _item(project, trajectory, kind=LabelKind.STEP_LABEL, other=None):
    return QueueItem.objects.create(project=project, kind=kind, trajectory=trajectory, other_trajectory=other)


# The canonical answer --------------------------------------------------------------------------------------------


def test_a_gold_comparison_answer_is_translated_to_canonical_order(make_trajectory):
    first, second = make_trajectory(), make_trajectory()
    assert gold_answer_for_comparison(first, second, "a") == {"choice": "a"}
    # "second is better than first" names second as a, but canonically first (the lower id) is a.
    assert gold_answer_for_comparison(second, first, "a") == {"choice": "b"}
    assert gold_answer_for_comparison(second.pk, first.pk, "b") == {"choice": "a"}
    assert gold_answer_for_comparison(second, first, "tie") == {"choice": "tie"}
    with pytest.raises(ValidationError) as excinfo:
        gold_answer_for_comparison(first, second, "left")
    assert "gold_answer" in excinfo.value.message_dict


# Scoring ---------------------------------------------------------------------------------------------------------


def test_a_comparison_is_correct_when_its_choice_is_the_gold_choice(project, annotator, make_trajectory):
    a, b = make_trajectory(), make_trajectory()
    item = _item(project, a, LabelKind.COMPARISON, other=b)
    set_gold(item, gold_answer_for_comparison(b, a, "a"))  # b is better
    label = Comparison.objects.create(project=project, annotator=annotator, trajectory_a=a, trajectory_b=b, choice="b")
    assert gold_correct(item, [label])
    assert not gold_correct(item, [label.revise(choice="tie")])
    assert not gold_correct(item, [])


def test_first_error_gold_needs_the_first_minus_one_on_that_step(project, annotator, make_trajectory):
    trajectory = make_trajectory(n_steps=4)
    item = set_gold(_item(project, trajectory), {"first_error": 2})
    steps = list(trajectory.steps.order_by("index"))

    def labels(values):
        return [StepLabel(step=steps[i], value=v) for i, v in values.items()]

    assert gold_correct(item, labels({0: 1, 1: 1, 2: -1}))
    assert gold_correct(item, labels({0: 1, 1: 0, 2: -1, 3: -1}))  # later -1s do not matter
    assert not gold_correct(item, labels({0: 1, 1: -1, 2: -1}))  # flagged too early
    assert not gold_correct(item, labels({0: 1, 1: 1, 2: 1}))  # missed it
    clean = set_gold(_item(project, make_trajectory(n_steps=2)), {"first_error": None})
    clean_steps = list(clean.trajectory.steps.order_by("index"))
    assert gold_correct(clean, [StepLabel(step=clean_steps[0], value=1), StepLabel(step=clean_steps[1], value=0)])
    assert not gold_correct(clean, [StepLabel(step=clean_steps[1], value=-1)])


def test_values_gold_needs_every_listed_step_labelled_so(project, make_trajectory):
    trajectory = make_trajectory(n_steps=3)
    item = set_gold(_item(project, trajectory), {"values": {2: -1, 0: 1}})
    assert item.gold_answer == {"values": {"0": 1, "2": -1}}  # JSON keys, in step order
    steps = list(trajectory.steps.order_by("index"))
    assert gold_correct(item, [StepLabel(step=steps[0], value=1), StepLabel(step=steps[2], value=-1)])
    assert gold_correct(item, [StepLabel(step=s, value=v) for s, v in zip(steps, (1, 0, -1), strict=True)])
    assert not gold_correct(item, [StepLabel(step=steps[0], value=1)])  # step 2 unlabelled
    assert not gold_correct(item, [StepLabel(step=steps[0], value=0), StepLabel(step=steps[2], value=-1)])


# A researcher's gold ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "answer", "field", "message"),
    [
        (LabelKind.COMPARISON, {"choice": "left"}, "gold_answer", "one of a, b, tie, both_bad"),
        (LabelKind.COMPARISON, "a", "gold_answer", "JSON object"),
        (LabelKind.STEP_LABEL, {"first_error": 3}, "gold_answer", "first_error 3 is not a step"),
        (LabelKind.STEP_LABEL, {"first_error": True}, "gold_answer", "first_error True is not a step"),
        (LabelKind.STEP_LABEL, {"values": {"1": 2}}, "gold_answer", "step 1 is 2; use -1, 0 or 1"),
        (LabelKind.STEP_LABEL, {"values": {"x": 1}}, "gold_answer", "'x' is not a step"),
        (LabelKind.STEP_LABEL, {"values": {}}, "gold_answer", "values must map"),
        (LabelKind.STEP_LABEL, {"first_error": 1, "values": {}}, "gold_answer", "Give either"),
        (LabelKind.RATING, {"score": 3}, "kind", "not ratings"),
    ],
)
def test_set_gold_rejects_a_bad_answer_naming_the_field(project, make_trajectory, kind, answer, field, message):
    a, b = make_trajectory(n_steps=3), make_trajectory(n_steps=3)
    item = _item(project, a, kind, other=b if kind == LabelKind.COMPARISON else None)
    with pytest.raises(ValidationError) as excinfo:
        set_gold(item, answer)
    assert message in " ".join(excinfo.value.message_dict[field])
    item.refresh_from_db()
    assert not item.is_gold and item.gold_answer is None


def test_set_gold_marks_the_item_and_stores_the_answer(project, make_trajectory):
    item = _item(project, make_trajectory(n_steps=3))
    set_gold(item, {"first_error": "1"})
    item.refresh_from_db()
    assert item.is_gold and item.gold_answer == {"first_error": 1}


# Gold from the oracle --------------------------------------------------------------------------------------------


@pytest.fixture
def second_task(project):
    return Task.objects.create(project=project, instruction="reach the goal", seed=8, spec={"seed": 8})


def test_gold_comparisons_pair_clearly_better_and_worse_trajectories(project, task, second_task, make_trajectory):
    winners = [make_trajectory(outcome_return=1.0), make_trajectory(oracle={"true_return": 1.0})]
    losers = [make_trajectory(outcome_return=0.0), make_trajectory(oracle={"true_return": 0.0}, outcome_return=1.0)]
    # On the second task the returns are too close to be a clear answer.
    make_trajectory(task=second_task, outcome_return=0.5)
    make_trajectory(task=second_task, outcome_return=0.3)

    items = make_gold_items(project, count=10, kind=LabelKind.COMPARISON, priority=5)

    assert len(items) == 4  # every winner against every loser, nothing from the close task
    returns = {t.pk: 1.0 for t in winners} | {t.pk: 0.0 for t in losers}  # the oracle beats outcome_return
    for item in QueueItem.objects.filter(pk__in=[i.pk for i in items]):
        assert item.is_gold and item.kind == LabelKind.COMPARISON and item.priority == 5
        assert item.trajectory_id < item.other_trajectory_id  # canonical, like Comparison
        a_is_better = returns[item.trajectory_id] > returns[item.other_trajectory_id]
        assert item.gold_answer == {"choice": "a" if a_is_better else "b"}
        assert item.query_strategy == "gold_oracle" and item.overlap == project.overlap
    # A pair that is already gold is not made twice.
    assert make_gold_items(project, count=10, kind=LabelKind.COMPARISON) == []


def test_gold_comparisons_spread_over_tasks_and_trajectories(project, task, second_task, make_trajectory):
    for each in (task, second_task):
        for value in (1.0, 1.0, 0.0, 0.0):
            make_trajectory(task=each, outcome_return=value)
    two = make_gold_items(project, count=2, kind=LabelKind.COMPARISON)
    assert {item.trajectory.task_id for item in two} == {task.pk, second_task.pk}
    four = make_gold_items(project, count=2, kind=LabelKind.COMPARISON)
    used = [t for item in two + four for t in (item.trajectory_id, item.other_trajectory_id)]
    assert len(used) == len(set(used)) == 8  # each trajectory once before any is used twice


def test_gold_step_items_use_the_stored_step_correctness(project, make_trajectory):
    flawed = make_trajectory(n_steps=3, oracle={"step_correct": [True, False, True], "true_return": 0.0})
    perfect = make_trajectory(n_steps=2, oracle={"step_correct": [True, True], "true_return": 1.0})
    items = make_gold_items(project, count=5, kind=LabelKind.STEP_LABEL)
    answers = {item.trajectory_id: item.gold_answer for item in items}
    assert answers == {flawed.pk: {"first_error": 1}, perfect.pk: {"first_error": None}}
    assert make_gold_items(project, count=5, kind=LabelKind.STEP_LABEL) == []


def test_without_stored_facts_the_environment_oracle_is_replayed(project, task):
    oracle = GridWorld().oracle(task.spec)
    solved: list[str] = []
    while best := oracle.best_actions(solved):
        solved.append(best[0])
    first = oracle.best_actions([])[0]
    detour = next(a for a in ACTIONS if a not in oracle.best_actions([first]))
    good = _played(project, task, solved)
    bad = _played(project, task, [first, detour])

    [pair] = make_gold_items(project, count=1, kind=LabelKind.COMPARISON)
    assert (pair.trajectory_id, pair.other_trajectory_id) == (good.pk, bad.pk)
    assert pair.gold_answer == {"choice": "a"}
    steps = {item.trajectory_id: item.gold_answer for item in make_gold_items(project, count=2, kind="step_label")}
    assert steps == {good.pk: {"first_error": None}, bad.pk: {"first_error": 1}}


def test_trajectories_without_any_known_answer_are_skipped(project):
    imported = Task.objects.create(project=project, instruction="book a flight", external_id="flight")
    _played(project, imported, ["search"])
    _played(project, imported, ["book"])
    assert make_gold_items(project, count=3, kind=LabelKind.COMPARISON) == []
    assert make_gold_items(project, count=3, kind=LabelKind.STEP_LABEL) == []


def test_make_gold_items_rejects_a_bad_count_or_kind(project):
    with pytest.raises(ValueError, match="count must be at least 1"):
        make_gold_items(project, count=0, kind=LabelKind.COMPARISON)
    with pytest.raises(ValueError, match="kind must be comparison or step_label"):
        make_gold_items(project, count=1, kind=LabelKind.RATING)


def test_the_command_makes_gold_items_and_reports_a_shortfall(project, make_trajectory, capsys):
    make_trajectory(outcome_return=1.0)
    make_trajectory(outcome_return=0.0)
    call_command("make_gold_items", project.slug, "--count", "3", "--kind", "comparison")
    out, err = capsys.readouterr()
    assert "Created 1 gold comparison item in" in out
    assert "Asked for 3, but only 1" in err
    assert QueueItem.objects.filter(project=project, is_gold=True).count() == 1
    with pytest.raises(CommandError, match="no project with slug 'nope'"):
        call_command("make_gold_items", "nope", "--count", "1", "--kind", "comparison")
