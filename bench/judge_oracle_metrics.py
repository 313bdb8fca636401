"""The metric code of bench/judge_oracle.py, free of models: the trivial baselines a judge is held against (random,
"shorter trajectory wins", "nearer at the end wins", "the action follows the reasoning"), the oracle's judged pairs
of held-out episodes, and pairwise accuracy by pair type with a 95 % interval from resampling whole tasks."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from reward_models.policy.turns import parse_decision
from simulation.episodes import PAIR_TYPES, OracleEpisode, oracle_pairs, pair_type

BOOTSTRAP_RESAMPLES = 1000


def stated_distance(episode: OracleEpisode) -> int | None:
    """The distance to the goal the last decision's reasoning states (``goal is down 2 left 1`` -> 3), or None
    when it states none. It is the distance before the last action: the conversation ends at that decision."""
    last = next(message for message in reversed(episode.messages) if message["role"] == "assistant")
    reasoning, _ = parse_decision(last["content"])
    numbers = [int(word) for word in reasoning.split() if word.isdigit()]
    return sum(numbers) if numbers else None


def follows_reasoning(decision: str) -> bool:
    """Whether a decision's action goes the way its reasoning says the goal lies (``goal is down 2 left 0 ;
    action down``): the process reward model's telling baseline. It cannot see walls."""
    reasoning, action = parse_decision(decision)
    words = reasoning.split()
    offsets = {word: int(number) for word, number in zip(words, words[1:], strict=False) if number.isdigit()}
    return offsets.get(action, 0) > 0


def smaller_wins(better: float | None, worse: float | None) -> float:
    """1 when the oracle's better trajectory has the smaller key, 0 when larger, 1/2 on a tie or an unknown key."""
    if better is None or worse is None or better == worse:
        return 0.5
    return 1.0 if better < worse else 0.0


BASELINES: dict[str, Callable[[OracleEpisode, OracleEpisode], float]] = {
    "random": lambda better, worse: 0.5,
    "shorter_wins": lambda better, worse: smaller_wins(len(better.actions), len(worse.actions)),
    "nearer_at_end_wins": lambda better, worse: smaller_wins(stated_distance(better), stated_distance(worse)),
    "shorter_then_nearer_wins": lambda better, worse: (
        smaller_wins(len(better.actions), len(worse.actions))
        if len(better.actions) != len(worse.actions)
        else smaller_wins(stated_distance(better), stated_distance(worse))
    ),
}


def judged_pairs(episodes: Sequence[OracleEpisode]) -> list[tuple[OracleEpisode, OracleEpisode]]:
    """(better, worse) by the oracle's `progress_return` for every pair of one task whose returns differ."""
    return [(a, b) if a.score > b.score else (b, a) for a, b in oracle_pairs(episodes) if a.score != b.score]


def pair_accuracy(
    pairs: Sequence[tuple[OracleEpisode, OracleEpisode]],
    outcome: Callable[[OracleEpisode, OracleEpisode], float],
    seed: int = 0,
) -> dict[str, Any]:
    """Mean outcome (1 right, 0 wrong, 1/2 undecided) overall and by pair type, each with a 95 % interval from
    resampling whole tasks (pairs of one task share trajectories, so they are not independent)."""
    groups: dict[str, list[tuple[OracleEpisode, OracleEpisode]]] = {"all": list(pairs)}
    for better, worse in pairs:
        groups.setdefault(pair_type(better, worse), []).append((better, worse))
    figures: dict[str, Any] = {}
    for name in ("all", *PAIR_TYPES):
        members = groups.get(name, [])
        if not members:
            figures[name] = {"pairs": 0}
            continue
        by_task: dict[int, list[float]] = {}
        for better, worse in members:
            by_task.setdefault(better.task_id, []).append(outcome(better, worse))
        values = [value for task_values in by_task.values() for value in task_values]
        figures[name] = {"pairs": len(values), "accuracy": statistics.fmean(values), **_task_interval(by_task, seed)}
    return figures


def _task_interval(by_task: dict[int, list[float]], seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    tasks = list(by_task.values())
    means = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        drawn = [rng.choice(tasks) for _ in tasks]
        means.append(sum(sum(t) for t in drawn) / sum(len(t) for t in drawn))
    means.sort()
    return {"low": means[int(0.025 * len(means))], "high": means[int(0.975 * len(means)) - 1]}
