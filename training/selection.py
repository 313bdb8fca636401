"""Active query selection: which comparison pairs go to the annotators (the project's `query_strategy`).

The candidates are the pairs of trajectories of one task that are not queued yet. Trajectories without steps are left
out: the `preference` export drops such pairs, so a label on one would never be trained on. The strategies:

- ``random``: a uniform sample of the candidates (seeded).
- ``disagreement``: the pairs where the members of the reward-model ensemble disagree most (PEBBLE, B-Pref's
  "ensemble disagreement"). Member m gives P_m(A > B) = sigmoid(r_m(A) - r_m(B)); a pair's score is the standard
  deviation of P_m over the members.
- ``uncertainty``: the pairs whose mean P(A > B) over the members is nearest 1/2.
- ``new_vs_parent``: a trajectory of a policy version against one of its parent version's on the same task, the
  newest version's pairs first, spread over the tasks (the i-th pair of every task before the (i + 1)-th of any).

Both reward-model strategies read the trajectories exactly as the reward model was trained on them: the `preference`
export's conversation (`Trajectory.objects.conversations`), the instruction and first observation as the prompt and
the rest as the completion, as review rollouts (`training.rollouts`) and PPO's reward side score them too.

`queue_selection` is what the queue uses. It records on every item the strategy that really chose it: without a
registered reward model, ``disagreement`` and ``uncertainty`` fall back to ``random``; a one-member reward model has
no disagreement to measure, so ``disagreement`` then ranks by ``uncertainty``; and ``new_vs_parent`` fills the part of
its budget that child/parent pairs cannot fill with random pairs among the given trajectories, recorded as
``random``. Each fallback is logged and shown in the result.

    >>> items = queue_selection(project, trajectories, 32).items  # doctest: +SKIP
    >>> {item.query_strategy for item in items}  # doctest: +SKIP
    {'disagreement'}
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from feedback_app.models import JudgeKind, LabelKind, Project, QueueItem, RegisteredModel, RunStatus, Trajectory
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.queue import pairs_within_tasks
from feedback_app.models.trajectories import TrajectorySource

if TYPE_CHECKING:
    from reward_models.reward.model import RewardModel

logger = logging.getLogger(__name__)

STRATEGIES = tuple(QueryStrategy.values)
NEEDS_REWARD_MODEL = (QueryStrategy.DISAGREEMENT, QueryStrategy.UNCERTAINTY)
# Recorded on step-label items chosen as the trajectories the reward model scores lowest.
LOW_REWARD = "low_reward"

Pair = tuple[Trajectory, Trajectory]


class Scorer(Protocol):
    """What selection needs of a reward model: each member's reward per (prompt, completion), ``[member][example]``
    (`reward_models.reward.model.RewardModel` is one)."""

    def member_rewards(self, prompts: Sequence, completions: Sequence) -> list[list[float]]: ...


# --- candidates and scores ---------------------------------------------------------------------------------------


def candidate_pairs(project: Project, trajectories: Sequence[Trajectory]) -> list[Pair]:
    """Pairs of `trajectories` that share a task, in id order, without pairs the project already has a comparison
    item of (gold or not) and without trajectories that have no steps."""
    with_steps = [t for t in {t.pk: t for t in trajectories}.values() if t.num_steps > 0]
    ids = [t.pk for t in with_steps]
    queued = set(
        QueueItem.objects.filter(project=project, kind=LabelKind.COMPARISON, trajectory__in=ids).values_list(
            "trajectory_id", "other_trajectory_id"
        )
    )
    return [(a, b) for a, b in pairs_within_tasks(with_steps) if (a.pk, b.pk) not in queued]


def member_rewards(trajectories: Sequence[Trajectory], scorer: Scorer) -> dict[int, list[float]]:
    """Each trajectory's reward from every member of `scorer`, by trajectory id, read as the reward model was
    trained: the preference export's conversation, split after the instruction and the first observation."""
    ids = list(dict.fromkeys(t.pk for t in trajectories))
    if not ids:
        return {}
    conversations = Trajectory.objects.conversations(ids)
    messages = [conversations[pk] for pk in ids]
    per_member = scorer.member_rewards([m[:2] for m in messages], [m[2:] for m in messages])
    return {pk: [rewards[index] for rewards in per_member] for index, pk in enumerate(ids)}


def pair_probabilities(pairs: Sequence[Pair], rewards: dict[int, list[float]]) -> list[list[float]]:
    """P_m(A > B) = sigmoid(r_m(A) - r_m(B)) for each pair and member: ``[pair][member]``."""
    return [[_sigmoid(ra - rb) for ra, rb in zip(rewards[a.pk], rewards[b.pk], strict=True)] for a, b in pairs]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def disagreement(probabilities: Sequence[float]) -> float:
    """The members' standard deviation of P(A > B) (population form: the members are the whole ensemble)."""
    return statistics.pstdev(probabilities)


def closeness_to_even(probabilities: Sequence[float]) -> float:
    """How near the members' mean P(A > B) is to 1/2: 0 at certainty, 1/2 at a coin toss."""
    return 0.5 - abs(statistics.fmean(probabilities) - 0.5)


# --- selection ---------------------------------------------------------------------------------------------------


def select_pairs(
    candidates: Sequence[Pair],
    budget: int,
    strategy: str,
    *,
    scorer: Scorer | None = None,
    rng: random.Random | None = None,
) -> list[Pair]:
    """At most `budget` of `candidates`, the best first by `strategy` (ties keep the candidates' order).

    ``disagreement`` and ``uncertainty`` need a `scorer`; ``disagreement`` needs at least two members.
    ``new_vs_parent`` returns only child/parent pairs, so it may return fewer than `budget` (`queue_selection` fills
    the rest)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if budget < 0:
        raise ValueError(f"budget must be at least 0, got {budget}")
    rewards = None
    if strategy in NEEDS_REWARD_MODEL:
        if scorer is None:
            raise ValueError(f"scorer: the {strategy} strategy needs a reward model")
        rewards = member_rewards([t for pair in candidates for t in pair], scorer)
    return _select(candidates, budget, strategy, rewards, rng or random.Random(0))


def _select(
    candidates: Sequence[Pair],
    budget: int,
    strategy: str,
    rewards: dict[int, list[float]] | None,
    rng: random.Random,
) -> list[Pair]:
    if budget == 0 or not candidates:
        return []
    if strategy == QueryStrategy.RANDOM:
        return rng.sample(list(candidates), min(budget, len(candidates)))
    if strategy == QueryStrategy.NEW_VS_PARENT:
        return _child_parent_pairs(candidates)[:budget]
    probabilities = pair_probabilities(candidates, rewards)
    if strategy == QueryStrategy.DISAGREEMENT:
        if any(len(p) < 2 for p in probabilities):
            raise ValueError("scorer: disagreement needs a reward-model ensemble of at least two members")
        scores = [disagreement(p) for p in probabilities]
    else:
        scores = [closeness_to_even(p) for p in probabilities]
    order = sorted(range(len(candidates)), key=lambda index: -scores[index])
    return [candidates[index] for index in order[:budget]]


def _child_parent_pairs(candidates: Sequence[Pair]) -> list[Pair]:
    """The pairs of a version's trajectory and its parent version's, as (child, parent), the newest child version
    first; within a version, round-robin over the tasks so that a small budget covers many tasks."""
    rows = []
    rank_in_task: Counter[tuple[int, int]] = Counter()
    for a, b in candidates:
        child, parent = _as_child_and_parent(a, b)
        if child is None:
            continue
        version = child.policy_version
        rank = rank_in_task[(version.pk, child.task_id)]
        rank_in_task[(version.pk, child.task_id)] += 1
        rows.append((version.created_at, version.pk, rank, child.task_id, (child, parent)))
    rows.sort(key=lambda row: row[2:4])
    rows.sort(key=lambda row: row[:2], reverse=True)  # stable: keeps the round-robin order within a version
    return [row[-1] for row in rows]


def _as_child_and_parent(a: Trajectory, b: Trajectory) -> tuple[Trajectory | None, Trajectory | None]:
    va, vb = a.policy_version, b.policy_version
    if va is None or vb is None:
        return None, None
    if va.parent_id is not None and va.parent_id == vb.pk:
        return a, b
    if vb.parent_id is not None and vb.parent_id == va.pk:
        return b, a
    return None, None


# --- the project's reward model ----------------------------------------------------------------------------------


def newest_reward_model(project: Project, device: str | None = None) -> RewardModel | None:
    """The project's newest registered reward model whose run succeeded, loaded (once per directory and process:
    a registered directory never changes, and a rollout run asks for it again and again)."""
    registered = (
        RegisteredModel.objects.filter(project=project, kind=JudgeKind.REWARD_MODEL, run__status=RunStatus.SUCCEEDED)
        .order_by("-created_at", "-id")
        .first()
    )
    if registered is None:
        return None
    return _load_reward_model(registered.path, device)


@lru_cache(maxsize=2)
def _load_reward_model(path: str, device: str | None) -> RewardModel:
    from reward_models.reward.model import load_reward_model

    return load_reward_model(path, device)


# --- queueing ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SelectionOptions:
    """How `queue_selection` and `queue_step_reviews` choose and queue, where the project's settings are not enough:
    another `strategy` than the project's; the reward model to score with (`scorer`; default: the project's newest),
    or the `scores` it gave beforehand (each trajectory's member rewards by id, `member_rewards`: a caller that queues
    in a transaction scores outside it); the random source (`rng`; default: one seeded with 0 per call); the items'
    `priority`; and where the notes on any fallback are logged (`log`; default: this module's logger)."""

    strategy: str | None = None
    scorer: Scorer | None = None
    rng: random.Random | None = None
    priority: int = 0
    log: Callable[[str], None] | None = None
    scores: dict[int, list[float]] | None = None


@dataclass
class Queued:
    """What `queue_selection` and `queue_step_reviews` queued, by the strategy that really chose each item, and why
    it differs from the project's setting where it does."""

    items: list[QueueItem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def by_strategy(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item.query_strategy] = counts.get(item.query_strategy, 0) + 1
        return counts

    def note(self, line: str, options: SelectionOptions) -> None:
        """Keep and log why another strategy than the one asked for chose the items."""
        self.notes.append(line)
        (options.log or logger.info)(line)


def queue_selection(
    project: Project, trajectories: Sequence[Trajectory], budget: int, options: SelectionOptions | None = None
) -> Queued:
    """Queue up to `budget` comparisons among `trajectories` (pairs of one task) chosen by the project's strategy
    and scored with its newest reward model, unless `options` say otherwise. Every item records the strategy that
    really chose it; the result also holds the notes on any fallback, which are logged too."""
    options = options or SelectionOptions()
    strategy = options.strategy or project.query_strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if budget < 0:
        raise ValueError(f"budget must be at least 0, got {budget}")
    rng = options.rng or random.Random(0)
    result = Queued()
    trajectories = _with_versions(trajectories)
    candidates = candidate_pairs(project, trajectories)
    used, rewards = strategy, None
    if strategy in NEEDS_REWARD_MODEL:
        rewards = _rewards(project, [t for pair in candidates for t in pair], options)
        if rewards is None:
            used = QueryStrategy.RANDOM
            result.note(f"the project has no reward model yet: {strategy} selection fell back to random", options)
        elif candidates:
            one_member = len(next(iter(rewards.values()))) < 2
            if strategy == QueryStrategy.DISAGREEMENT and one_member:
                used = QueryStrategy.UNCERTAINTY
                result.note(
                    "the reward model has one member, so no disagreement to measure: ranked by uncertainty", options
                )
    if used == QueryStrategy.NEW_VS_PARENT:
        partners = parent_trajectories(trajectories)
        chosen = _select(candidate_pairs(project, [*trajectories, *partners]), budget, used, None, rng)
        result.items += QueueItem.objects.enqueue_comparisons(
            project, chosen, priority=options.priority, query_strategy=used
        )
        left = budget - len(result.items)
        if left > 0:
            taken = {_key(pair) for pair in chosen}
            rest = [pair for pair in candidates if _key(pair) not in taken]
            filler = _select(rest, left, QueryStrategy.RANDOM, None, rng)
            if filler:
                result.note(
                    f"only {len(chosen)} new-against-parent pairs: {len(filler)} random pairs fill the budget", options
                )
            result.items += QueueItem.objects.enqueue_comparisons(
                project, filler, priority=options.priority, query_strategy=QueryStrategy.RANDOM
            )
    else:
        chosen = _select(candidates, budget, used, rewards, rng)
        result.items += QueueItem.objects.enqueue_comparisons(
            project, chosen, priority=options.priority, query_strategy=used
        )
    return result


def queue_step_reviews(
    project: Project, trajectories: Sequence[Trajectory], budget: int, options: SelectionOptions | None = None
) -> Queued:
    """Queue up to `budget` of `trajectories` for step labels. Under a reward-model strategy (disagreement,
    uncertainty) the ones the reward model (or the `scores` in `options`, as `queue_selection` reads them) scores
    lowest go first, recorded as ``low_reward``: a poor trajectory most likely has a wrong step to mark. Otherwise,
    or without a reward model, a random sample, recorded as ``random``. Trajectories already queued for step labels,
    or without steps, are left out."""
    options = options or SelectionOptions()
    strategy = options.strategy or project.query_strategy
    rng = options.rng or random.Random(0)
    result = Queued()
    if budget <= 0:
        return result
    queued = set(
        QueueItem.objects.filter(
            project=project, kind=LabelKind.STEP_LABEL, trajectory__in=[t.pk for t in trajectories]
        ).values_list("trajectory_id", flat=True)
    )
    unique = {t.pk: t for t in trajectories}.values()
    candidates = [t for t in unique if t.num_steps and t.pk not in queued]
    rewards = None
    if strategy in NEEDS_REWARD_MODEL:
        rewards = _rewards(project, candidates, options)
        if rewards is None:
            result.note(
                f"the project has no reward model yet: step-label items are a random sample, not {LOW_REWARD}", options
            )
    if rewards is not None and candidates:
        mean = {pk: statistics.fmean(values) for pk, values in rewards.items()}
        chosen = sorted(candidates, key=lambda t: mean[t.pk])[:budget]
        result.items += QueueItem.objects.enqueue_trajectories(
            project, chosen, priority=options.priority, query_strategy=LOW_REWARD
        )
    else:
        chosen = rng.sample(candidates, min(budget, len(candidates)))
        result.items += QueueItem.objects.enqueue_trajectories(
            project, chosen, priority=options.priority, query_strategy=QueryStrategy.RANDOM
        )
    return result


def _rewards(
    project: Project, trajectories: Sequence[Trajectory], options: SelectionOptions
) -> dict[int, list[float]] | None:
    """Each trajectory's member rewards: read from the options' `scores` where given (computed beforehand), else from
    their `scorer` or the project's newest reward model; None when the project has none."""
    scores = options.scores
    if scores is not None:
        missing = sorted({t.pk for t in trajectories} - set(scores))
        if missing:
            raise ValueError(f"scores: no member rewards for trajectories {missing[:5]}")
        return {t.pk: scores[t.pk] for t in trajectories}
    scorer = options.scorer or newest_reward_model(project)
    return None if scorer is None else member_rewards(trajectories, scorer)


def parent_trajectories(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The rollouts (not intervention branches) of the parents of the versions of `trajectories`, on their tasks."""
    parents = {t.policy_version.parent_id for t in trajectories if t.policy_version and t.policy_version.parent_id}
    if not parents:
        return []
    rows = Trajectory.objects.filter(
        policy_version__in=parents,
        task__in={t.task_id for t in trajectories},
        source=TrajectorySource.POLICY,
        parent__isnull=True,
    ).select_related("policy_version")
    return list(rows.order_by("id"))


def _with_versions(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The trajectories again, with their policy versions, in one query (new_vs_parent reads each one's parent)."""
    loaded = Trajectory.objects.select_related("policy_version").in_bulk([t.pk for t in trajectories])
    return [loaded[t.pk] for t in trajectories if t.pk in loaded]


def _key(pair: Pair) -> tuple[int, int]:
    a, b = pair
    return (a.pk, b.pk) if a.pk < b.pk else (b.pk, a.pk)
