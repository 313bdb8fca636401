"""Gold items: queue items with a known answer, mixed into the queue unannounced to measure each annotator.

A gold answer is stored on the item (`QueueItem.gold_answer`, with `is_gold`) as JSON:

- comparison: ``{"choice": "a" | "b" | "tie" | "both_bad"}`` in canonical terms, like `Comparison.choice`: "a" is
  the trajectory with the lower id. `gold_answer_for_comparison` translates an answer given in any order.
- step_label: ``{"first_error": step_index}`` (``null``: no step is wrong), or ``{"values": {step_index: -1|0|1}}``
  for the steps whose label is known (JSON object keys are strings).

Scoring (`gold_correct`): a comparison is correct when its choice equals the gold choice. For step labels with
``first_error``, the annotator's first -1 must be that step (and no -1 at all when it is null); with ``values``,
every listed step must carry exactly that label. One gold item counts once per annotator, and only once their
assignment is handed in (a half-labelled trajectory is not an answer yet).

Gold comes from a researcher (`set_gold`) or from the environment's oracle (`make_gold_items`, and the
`make_gold_items` management command).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from feedback_app.models import Comparison, LabelKind, Project, QueueItem, Step, StepLabel, Task, Trajectory
from feedback_app.models.labels import ComparisonChoice, StepLabelValue
from feedback_app.models.queue import AssignmentStatus

GOLD_KINDS = (LabelKind.COMPARISON, LabelKind.STEP_LABEL)
ORACLE_STRATEGY = "gold_oracle"


@dataclass(frozen=True)
class GoldScore:
    correct: int = 0
    total: int = 0

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.total if self.total else None


def gold_answer_for_comparison(trajectory_a, trajectory_b, choice: str) -> dict[str, str]:
    """The gold answer for "`choice` between `trajectory_a` (as a) and `trajectory_b` (as b)", in the canonical
    terms a queue item and a Comparison use (a is the lower id). Trajectories or their ids.

    >>> gold_answer_for_comparison(9, 4, "a")   # 9 is better than 4; canonically 4 is a, so b is better
    {'choice': 'b'}
    """
    first, second = getattr(trajectory_a, "pk", trajectory_a), getattr(trajectory_b, "pk", trajectory_b)
    if first == second:
        raise ValidationError({"other_trajectory": "A trajectory cannot be compared with itself."})
    if choice not in ComparisonChoice.values:
        raise ValidationError({"gold_answer": f"choice must be one of {', '.join(ComparisonChoice.values)}."})
    if first > second and choice in (ComparisonChoice.A, ComparisonChoice.B):
        choice = ComparisonChoice.B if choice == ComparisonChoice.A else ComparisonChoice.A
    return {"choice": str(choice)}


def answer_correct(kind: str, gold_answer: dict | None, given: dict[str, Any]) -> bool:
    """Whether `given` matches the gold answer. `given` is ``{"choice": ...}`` for a comparison and
    ``{"values": {step_index: value}}`` (the annotator's step labels of the trajectory) for step labels."""
    if not gold_answer:
        return False
    if kind == LabelKind.COMPARISON:
        return given.get("choice") == gold_answer.get("choice")
    if kind == LabelKind.STEP_LABEL:
        values = {int(index): value for index, value in given.get("values", {}).items()}
        if "first_error" in gold_answer:
            first_error = min((i for i, v in values.items() if v == StepLabelValue.BAD), default=None)
            return first_error == gold_answer["first_error"]
        expected = gold_answer.get("values") or {}
        return bool(expected) and all(values.get(int(index)) == value for index, value in expected.items())
    return False


def gold_correct(item: QueueItem, labels: Sequence[Comparison | StepLabel]) -> bool:
    """Whether one annotator's current labels of gold `item` (their comparison, or their step labels of its
    trajectory) give the gold answer. See the module docstring for the rules."""
    if item.kind == LabelKind.COMPARISON:
        given = {"choice": labels[-1].choice} if labels else {}
    else:
        given = {"values": {label.step.index: label.value for label in labels}}
    return answer_correct(item.kind, item.gold_answer, given)


def score_gold(answers: Iterable[tuple[int, str, dict | None, dict[str, Any]]]) -> defaultdict[int, GoldScore]:
    """Per annotator, correct and total gold answers, from ``(annotator_id, item_kind, gold_answer, given)``."""
    correct: Counter = Counter()
    total: Counter = Counter()
    for annotator_id, kind, gold_answer, given in answers:
        total[annotator_id] += 1
        correct[annotator_id] += answer_correct(kind, gold_answer, given)
    scores: defaultdict[int, GoldScore] = defaultdict(GoldScore)
    scores.update({annotator_id: GoldScore(correct[annotator_id], n) for annotator_id, n in total.items()})
    return scores


def gold_answers_given(project: Project) -> list[tuple]:
    """Every handed-in answer to a gold item of `project`: ``(annotator_id, item_kind, gold_answer, given)``.
    Two queries."""
    handed_in = {
        "project": project,
        "is_current": True,
        "assignment__item__is_gold": True,
        "assignment__status": AssignmentStatus.DONE,
    }
    item_fields = ("annotator_id", "assignment__item_id", "assignment__item__kind", "assignment__item__gold_answer")
    given: defaultdict[tuple[int, int], dict] = defaultdict(dict)
    items: dict[int, tuple[str, dict]] = {}
    for choice, annotator_id, item_id, kind, answer in (
        Comparison.objects.filter(**handed_in).order_by().values_list("choice", *item_fields)
    ):
        items[item_id] = (kind, answer)
        given[annotator_id, item_id]["choice"] = choice
    for index, value, annotator_id, item_id, kind, answer in (
        StepLabel.objects.filter(**handed_in).order_by().values_list("step__index", "value", *item_fields)
    ):
        items[item_id] = (kind, answer)
        given[annotator_id, item_id].setdefault("values", {})[index] = value
    return [(annotator_id, *items[item_id], answer) for (annotator_id, item_id), answer in given.items()]


def annotator_gold_accuracy(project: Project) -> dict[int, GoldScore]:
    """Per annotator id, how many gold items they answered in `project` and how many correctly. Two queries."""
    return dict(score_gold(gold_answers_given(project)))


def set_gold(item: QueueItem, answer: Any) -> QueueItem:
    """Make `item` a gold item with `answer` (see the module docstring), validated and normalised.

    Raises ValidationError naming the field. Changing the answer of an item already labelled rescores those labels.
    """
    item.gold_answer = validate_gold_answer(item, answer)
    item.is_gold = True
    item.save(update_fields=["is_gold", "gold_answer"])
    return item


def validate_gold_answer(item: QueueItem, answer: Any) -> dict[str, Any]:
    """The normalised form of `answer` for `item`, or a ValidationError on ``gold_answer`` saying what is wrong."""
    if item.kind not in GOLD_KINDS:
        raise ValidationError({"kind": f"Gold answers exist for comparisons and step labels, not {item.kind}s."})
    if not isinstance(answer, dict):
        raise ValidationError({"gold_answer": "Give the answer as a JSON object."})
    if item.kind == LabelKind.COMPARISON:
        if set(answer) != {"choice"} or answer["choice"] not in ComparisonChoice.values:
            raise ValidationError(
                {"gold_answer": f'Give {{"choice": ...}} with one of {", ".join(ComparisonChoice.values)}.'}
            )
        return {"choice": answer["choice"]}
    indices = set(Step.objects.filter(trajectory_id=item.trajectory_id).values_list("index", flat=True))
    if set(answer) == {"first_error"}:
        first_error = answer["first_error"]
        if first_error is not None and _step_index(first_error) not in indices:
            raise ValidationError(
                {"gold_answer": f"first_error {first_error!r} is not a step of the trajectory ({len(indices)} steps)."}
            )
        return {"first_error": None if first_error is None else _step_index(first_error)}
    if set(answer) == {"values"}:
        values = answer["values"]
        if not isinstance(values, dict) or not values:
            raise ValidationError({"gold_answer": "values must map step indices to -1, 0 or +1."})
        normalised = {}
        for index, value in values.items():
            if _step_index(index) not in indices:
                raise ValidationError({"gold_answer": f"values: {index!r} is not a step of the trajectory."})
            if isinstance(value, bool) or value not in StepLabelValue.values:
                raise ValidationError({"gold_answer": f"values: step {index} is {value!r}; use -1, 0 or 1."})
            normalised[str(_step_index(index))] = value
        return {"values": dict(sorted(normalised.items(), key=lambda entry: int(entry[0])))}
    raise ValidationError({"gold_answer": 'Give either {"first_error": step or null} or {"values": {step: value}}.'})


def _step_index(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


# Gold from the environment's oracle -----------------------------------------------------------------------------


def make_gold_items(
    project: Project,
    *,
    count: int,
    kind: str,
    priority: int = 0,
    min_margin: float = 0.5,
    overlap: int | None = None,
    seed: int = 0,
) -> list[QueueItem]:
    """Create up to `count` gold items whose answers the environment's oracle knows.

    comparison: pairs of trajectories of the same task whose true returns differ by at least `min_margin`; the
    answer is the one with the higher return. step_label: trajectories whose per-step correctness is known; the
    answer is the first step the oracle calls wrong (or none). Oracle facts stored with a rollout are used; where a
    trajectory lacks them they are computed by replaying its actions in the environment's oracle. Tasks take turns,
    so the gold spreads over tasks; a pair or trajectory that is already gold is not used again. Returns the new
    items (fewer than `count` when there are not enough candidates).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if kind not in GOLD_KINDS:
        raise ValueError(f"kind must be comparison or step_label, got {kind!r}")
    facts = _oracle_facts(project, kind)
    if kind == LabelKind.COMPARISON:
        items = _gold_comparisons(project, facts, count, min_margin)
    else:
        items = _gold_step_items(project, facts, count)
    for item in items:
        item.project = project
        item.kind = kind
        item.priority = priority
        item.overlap = overlap or project.overlap
        item.is_gold = True
        item.query_strategy = ORACLE_STRATEGY
    random.Random(seed).shuffle(items)  # no pattern in creation order for an annotator to learn
    with transaction.atomic():
        return QueueItem.objects.bulk_create(items)


@dataclass
class _Facts:
    trajectory_id: int
    task_id: int
    true_return: float | None
    step_correct: list[bool] | None
    num_steps: int


def _oracle_facts(project: Project, kind: str) -> list[_Facts]:
    rows = list(
        Trajectory.objects.filter(project=project)
        .order_by("id")
        .values_list("id", "task_id", "outcome_return", "oracle", "num_steps")
    )
    facts = []
    for trajectory_id, task_id, outcome_return, oracle, num_steps in rows:
        oracle = oracle or {}
        true_return = oracle.get("true_return", outcome_return)
        step_correct = oracle.get("step_correct")
        if step_correct is not None and len(step_correct) != num_steps:
            step_correct = None
        facts.append(_Facts(trajectory_id, task_id, true_return, step_correct, num_steps))
    if kind == LabelKind.COMPARISON:
        missing = [f for f in facts if f.num_steps and f.true_return is None]
    else:
        missing = [f for f in facts if f.num_steps and f.step_correct is None]
    if missing:
        _compute_from_environment(project, missing)
    return facts


def _compute_from_environment(project: Project, facts: list[_Facts]) -> None:
    """Fill in what the oracle says of trajectories stored without it (imports, or rollouts before the oracle)."""
    env = project.environment.load()
    tasks = {task.pk: task for task in Task.objects.filter(pk__in={f.task_id for f in facts})}
    actions: defaultdict[int, list[str]] = defaultdict(list)
    for trajectory_id, action in (
        Step.objects.filter(trajectory_id__in=[f.trajectory_id for f in facts])
        .order_by("trajectory_id", "index")
        .values_list("trajectory_id", "action")
    ):
        actions[trajectory_id].append(action)
    oracles = {}
    for fact in facts:
        task = tasks[fact.task_id]
        if not task.spec and task.seed is None:
            continue
        if task.pk not in oracles:
            oracles[task.pk] = env.oracle(task.spec or {"seed": task.seed, "instruction": task.instruction})
        oracle = oracles[task.pk]
        if oracle is None:
            continue
        played = actions[fact.trajectory_id]
        if fact.true_return is None:
            fact.true_return = oracle.true_return(played)
        if fact.step_correct is None:
            step_correct = oracle.step_correct(played)
            fact.step_correct = step_correct if len(step_correct) == fact.num_steps else None


def _round_robin(groups: dict[int, list]) -> list:
    """One candidate from each task in turn, tasks in id order, so the gold spreads over tasks."""
    queues = [list(groups[key]) for key in sorted(groups)]
    ordered = []
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    return ordered


def _gold_comparisons(project: Project, facts: list[_Facts], count: int, min_margin: float) -> list[QueueItem]:
    taken = set(
        QueueItem.objects.filter(project=project, kind=LabelKind.COMPARISON, is_gold=True).values_list(
            "trajectory_id", "other_trajectory_id"
        )
    )
    uses = Counter(trajectory_id for pair in taken for trajectory_id in pair)
    by_task: defaultdict[int, list[_Facts]] = defaultdict(list)
    for fact in facts:
        if fact.true_return is not None:
            by_task[fact.task_id].append(fact)
    pairs: dict[int, list[tuple[float, _Facts, _Facts]]] = {}
    for task_id, group in by_task.items():
        candidates = [
            (abs(low.true_return - high.true_return), low, high)
            for i, low in enumerate(group)
            for high in group[i + 1 :]
            if abs(low.true_return - high.true_return) >= min_margin
            and (low.trajectory_id, high.trajectory_id) not in taken
            and (high.trajectory_id, low.trajectory_id) not in taken
        ]
        # The clearest margins first, then trajectories that are in fewer gold pairs already; `_spread` then uses
        # each trajectory once before any is used again.
        candidates.sort(
            key=lambda c: (
                -c[0],
                uses[c[1].trajectory_id] + uses[c[2].trajectory_id],
                c[1].trajectory_id,
                c[2].trajectory_id,
            )
        )
        pairs[task_id] = _spread(candidates)
    return [
        QueueItem(
            trajectory_id=low.trajectory_id,
            other_trajectory_id=high.trajectory_id,
            gold_answer={"choice": ComparisonChoice.A if low.true_return > high.true_return else ComparisonChoice.B},
        )
        for _, low, high in _round_robin(pairs)[:count]
    ]


def _spread(candidates: list[tuple[float, _Facts, _Facts]]) -> list[tuple[float, _Facts, _Facts]]:
    """Reorder pairs so that each pass uses every trajectory at most once before any is used again."""
    ordered, remaining = [], list(candidates)
    while remaining:
        used: set[int] = set()
        rest = []
        for candidate in remaining:
            ids = {candidate[1].trajectory_id, candidate[2].trajectory_id}
            if used & ids:
                rest.append(candidate)
            else:
                ordered.append(candidate)
                used |= ids
        remaining = rest
    return ordered


def _gold_step_items(project: Project, facts: list[_Facts], count: int) -> list[QueueItem]:
    taken = set(
        QueueItem.objects.filter(project=project, kind=LabelKind.STEP_LABEL, is_gold=True).values_list(
            "trajectory_id", flat=True
        )
    )
    known = [f for f in facts if f.step_correct is not None and f.num_steps and f.trajectory_id not in taken]
    # Alternate trajectories with a wrong step and clean ones, so gold also catches annotators who flag too much.
    with_error = defaultdict(list)
    clean = defaultdict(list)
    for fact in known:
        (clean if all(fact.step_correct) else with_error)[fact.task_id].append(fact)
    ordered = []
    errors, cleans = _round_robin(with_error), _round_robin(clean)
    for i in range(max(len(errors), len(cleans))):
        ordered.extend(group[i] for group in (errors, cleans) if i < len(group))
    return [
        QueueItem(
            trajectory_id=fact.trajectory_id,
            gold_answer={"first_error": next((i for i, ok in enumerate(fact.step_correct) if not ok), None)},
        )
        for fact in ordered[:count]
    ]
