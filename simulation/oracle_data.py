"""Rows that oracle-labelled gridworld episodes (`simulation.episodes`) give, in the layouts of Tandem's exports.

The judge-model and policy pipelines train on exported snapshots. This module makes rows in exactly those layouts,
with the exports' own row contract (`reward_models.rows`), labelled the way a B-Pref scripted teacher would label
them, so that the pipelines can be tested, benchmarked and held against the oracle without a database:

- `preference_rows`: pairs within a task, preferred by the oracle's `progress_return` (a success beats a failure, a
  shorter success beats a longer one, and of two failures the one that ended nearer the goal wins), through
  P(a > b) = sigmoid(beta * (R_a - R_b)) with a mistake rate `epsilon`; differences within `equal_threshold` are ties.
- `stepwise_rows`: PRM800K-style step labels from the oracle's per-step correctness (a step is good when it brings
  the agent nearer the goal), flipped with probability `epsilon`; `intervention_rows` are the RLIF-style labels an
  intervention at the first wrong step implies.
- `returns_rows`: the environment's per-step rewards, for the value critic.
- `critique_rows`: template critiques that name the first wrong step.
- `intervention_step_preference_rows`, `intervention_sft_rows`, `unpaired_rows`: what an oracle annotator's
  corrections and thumbs give, for the policy trainers.

Every row is cut from an episode's conversation as the exports cut a trajectory's. Conversational rows carry the
``tools`` column (none for the gridworld). Rows may carry columns of their own after the export's, for evaluation
(`pair_type`, `oracle_labels`, ...).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from reward_models.envs.gridworld import GridWorld
from reward_models.policy.turns import parse_decision
from reward_models.rows import (
    CONVERSATIONAL,
    INTERVENTION_MARGIN,
    MARGIN_BY_STRENGTH,
    check_style,
    critique_pair,
    critique_request,
    critique_row,
    pair_row,
    preference_columns,
    returns_row,
    sft_row,
    split_at,
    split_pair,
    step_pieces,
    step_preference_columns,
    stepwise_row,
    unpaired_row,
)
from simulation.episodes import OracleEpisode, critique_text, oracle_correction, oracle_pairs, pair_type

# Strength (1 slight, 2 clear, 3 decisive) by the size of the oracle difference, as the exports' margins.
STRENGTH_BY_DIFFERENCE = ((0.5, 3), (0.2, 2), (0.0, 1))


def preference_rows(
    episodes: Sequence[OracleEpisode],
    *,
    beta: float | None = None,
    epsilon: float = 0.0,
    equal_threshold: float = 0.0,
    ties: str = "drop",
    style: str = "conversational",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Preference rows for the pairs within each task. `beta` None is a perfectly rational teacher (the higher
    oracle return always wins); otherwise the winner is drawn with P(a > b) = sigmoid(beta * (R_a - R_b)). With
    probability `epsilon` the answer is flipped. Pairs whose returns differ by at most `equal_threshold` are ties:
    dropped, or with ``ties="include"`` kept as rows with ``tie: true``. Rows carry `pair_type` and
    `oracle_preferred` (the row's chosen side is the oracle's better one) for evaluation."""
    if ties not in ("drop", "include"):
        raise ValueError(f"ties must be 'drop' or 'include', got {ties!r}")
    rng = random.Random(seed)
    rows = []
    for a, b in oracle_pairs(episodes):
        difference = a.score - b.score
        tie = abs(difference) <= equal_threshold
        if tie and ties == "drop":
            continue
        if tie:
            chosen, rejected = a, b
        else:
            p_a = (1.0 if difference > 0 else 0.0) if beta is None else 1.0 / (1.0 + math.exp(-beta * difference))
            a_wins = rng.random() < p_a
            if rng.random() < epsilon:
                a_wins = not a_wins
            chosen, rejected = (a, b) if a_wins else (b, a)
        columns = preference_columns(
            margin=0.0 if tie else MARGIN_BY_STRENGTH[_strength(difference)],
            agreement=1.0,
            rationale="",
            annotator_ids=[0],
            label_ids=[len(rows) + 1],
            task_id=a.task_id,
            chosen_trajectory_id=chosen.trajectory_id,
            rejected_trajectory_id=rejected.trajectory_id,
            tools=_tools(style),
            tie=tie,
        )
        cut = chosen.conversation.prompt_length
        row = pair_row(*split_pair(chosen.messages, rejected.messages, cut, style), columns)
        row.update(pair_type=pair_type(a, b), oracle_preferred=chosen.score > rejected.score)
        rows.append(row)
    return rows


def _strength(difference: float) -> int:
    return next(strength for bound, strength in STRENGTH_BY_DIFFERENCE if abs(difference) > bound)


def _tools(style: str) -> list | None:
    """The ``tools`` column of a conversational row: the gridworld offers none; a text row has no such column."""
    return [] if style == CONVERSATIONAL else None


def episode_steps(episode: OracleEpisode, style: str) -> tuple[Any, list[Any]]:
    """The prompt and one piece per step of an episode, as the stepwise and returns exports lay them out:
    conversational or text (`reward_models.rows.step_pieces`)."""
    check_style(style)
    return step_pieces(episode.conversation, style)


def stepwise_rows(
    episodes: Sequence[OracleEpisode], *, epsilon: float = 0.0, seed: int = 0, style: str = "conversational"
) -> list[dict[str, Any]]:
    """One row per episode: every step labelled by the oracle's correctness, each label flipped with probability
    `epsilon`. Rows carry `oracle_labels` (the unflipped truth) for evaluation."""
    rng = random.Random(seed)
    rows = []
    for episode in episodes:
        prompt, pieces = episode_steps(episode, style)
        labels = [correct != (rng.random() < epsilon) for correct in episode.step_correct]
        rows.append(_stepwise_row(episode, prompt, pieces, labels, "label", style))
    return rows


def intervention_rows(episodes: Sequence[OracleEpisode], *, style: str = "conversational") -> list[dict[str, Any]]:
    """The step labels an intervention at each episode's first wrong step implies (RLIF): the steps before it
    accepted, the intervened step rejected. Episodes without a wrong step give none."""
    rows = []
    for episode in episodes:
        error = episode.first_error
        if error is None:
            continue
        prompt, pieces = episode_steps(episode, style)
        labels = [True] * error + [False]
        rows.append(_stepwise_row(episode, prompt, pieces[: error + 1], labels, "intervention", style))
    return rows


def _stepwise_row(
    episode: OracleEpisode, prompt: Any, pieces: list[Any], labels: list[bool], source: str, style: str
) -> dict[str, Any]:
    row = stepwise_row(
        prompt,
        pieces,
        labels,
        step_indices=list(range(len(pieces))),
        agreement=1.0,
        annotator_ids=[0],
        label_ids=[episode.trajectory_id],
        trajectory_id=episode.trajectory_id,
        task_id=episode.task_id,
        source=source,
        tools=_tools(style),
    )
    row["oracle_labels"] = episode.step_correct[: len(pieces)]
    return row


def returns_rows(
    episodes: Sequence[OracleEpisode], *, with_rewards: bool = True, style: str = "text"
) -> list[dict[str, Any]]:
    """One row per episode with the environment's per-step rewards (or, with `with_rewards` False, null rewards
    and outcome, as for trajectories imported without them). The returns export writes text; ``style=
    "conversational"`` lays the steps out as the stepwise export's conversational rows do."""
    rows = []
    for episode in episodes:
        prompt, pieces = episode_steps(episode, style)
        rows.append(
            returns_row(
                prompt,
                pieces,
                list(episode.rewards) if with_rewards else None,
                episode.success if with_rewards else None,
                trajectory_id=episode.trajectory_id,
                task_id=episode.task_id,
                policy_version_id=None,
                tools=_tools(style),
            )
        )
    return rows


def critique_rows(episodes: Sequence[OracleEpisode], *, style: str = "conversational") -> list[dict[str, Any]]:
    """One whole-trajectory critique per episode, laid out as the `critiques` export writes them."""
    rows = []
    for episode in episodes:
        prompt, completion = critique_pair(episode.messages, critique_request(None), critique_text(episode), style)
        rows.append(
            critique_row(
                prompt,
                completion,
                trajectory_id=episode.trajectory_id,
                task_id=episode.task_id,
                step_index=None,
                span_field="",
                span_start=None,
                span_end=None,
                span_text="",
                tags=[],
                annotator_ids=[0],
                label_ids=[episode.trajectory_id],
            )
        )
    return rows


def vocabulary() -> list[str]:
    """Every word these rows hold beyond the gridworld policy's own (transcript roles, the critique request and
    templates), for building a word tokenizer that covers them."""
    return [
        "System: User: Assistant:",
        critique_request(None),
        "Critique the last step. this part of step's reasoning observation action",
        "step is wrong : moves away from the goal ; or was better",
        "every step moves toward the goal ; the agent reaches but runs out of steps",
        " ".join(str(n) for n in range(1, 65)),
    ]


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Rows as JSON lines, in the exports' compact UTF-8 form."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path


# The tiny base of the judge pipelines: small enough to train in seconds on a CPU, its window long enough for a
# whole gridworld episode's transcript.
TINY_BASE_SIZES = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 2048}


def build_tiny_base(path: str | Path, *, seed: int = 0, **sizes: int) -> Path:
    """An untrained tiny Llama directory whose word tokenizer covers every word of these rows (gridworld turns,
    transcript roles, critique templates): a base model for judge pipelines on oracle data, built offline. `sizes`
    override `TINY_BASE_SIZES` (`build_tiny_llama`'s keywords)."""
    from reward_models.policy.bootstrap import vocabulary_corpus
    from reward_models.policy.model import build_tiny_llama, save_policy
    from reward_models.policy.tokenizer import build_word_tokenizer

    tokenizer = build_word_tokenizer([*vocabulary_corpus(GridWorld()), *vocabulary()])
    model = build_tiny_llama(tokenizer, seed=seed, **{**TINY_BASE_SIZES, **sizes})
    return save_policy(model, tokenizer, path, history_window=0, max_new_tokens=32)


def intervention_step_preference_rows(
    episodes: Sequence[OracleEpisode], *, seed: int = 0, epsilon: float = 0.0
) -> list[dict[str, Any]]:
    """`step_preference` rows from an oracle annotator who intervenes at each episode's first wrong step: the prompt
    is every message before that step's assistant message, `chosen` the correction (`oracle_correction`, wrong with
    probability `epsilon`), `rejected` the policy's own step, as the export writes an intervention (margin 1, source
    "intervention"). Episodes without a wrong step give none. Rows carry `chosen_action` and `rejected_action` for
    analysis."""
    rng = random.Random(seed)
    rows = []
    for episode in episodes:
        error = episode.first_error
        if error is None:
            continue
        corrected = oracle_correction(episode, error, rng, epsilon)
        original = episode.conversation.assistant(error)
        if corrected["content"] == original.get("content"):
            continue
        columns = step_preference_columns(
            margin=INTERVENTION_MARGIN,
            agreement=1.0,
            rationale="",
            annotator_ids=[0],
            label_ids=[len(rows) + 1],
            source="intervention",
            step_index=error,
            task_id=episode.task_id,
            chosen_trajectory_id=None,
            rejected_trajectory_id=episode.trajectory_id,
            tools=[],
        )
        row = pair_row(episode.conversation.before_step(error), [corrected], [dict(original)], columns)
        row.update(chosen_action=parse_decision(corrected["content"])[1], rejected_action=episode.actions[error])
        rows.append(row)
    return rows


def intervention_sft_rows(
    episodes: Sequence[OracleEpisode], *, seed: int = 0, epsilon: float = 0.0
) -> list[dict[str, Any]]:
    """`sft` rows for the same interventions as `intervention_step_preference_rows` (the same seed and `epsilon`
    draw the same corrections): the conversation before the first wrong step, then the correction."""
    return [
        sft_row(
            [*pair["prompt"], *pair["chosen"]],
            [],
            source="intervention",
            step_index=pair["step_index"],
            annotator_ids=[0],
            label_ids=pair["label_ids"],
            trajectory_id=pair["rejected_trajectory_id"],
            task_id=pair["task_id"],
        )
        for pair in intervention_step_preference_rows(episodes, seed=seed, epsilon=epsilon)
    ]


def unpaired_rows(episodes: Sequence[OracleEpisode], *, epsilon: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """`unpaired` (KTO) rows: one thumb per episode, up for a success and down for a failure, flipped with
    probability `epsilon`; the prompt is the trajectory's prompt, the completion the rest of its conversation."""
    rng = random.Random(seed)
    rows = []
    for episode in episodes:
        if not episode.conversation.num_steps:
            continue
        prompt, completion = split_at(episode.messages, episode.conversation.prompt_length, CONVERSATIONAL)
        rows.append(
            unpaired_row(
                prompt,
                completion,
                episode.success != (rng.random() < epsilon),
                agreement=1.0,
                annotator_ids=[0],
                label_ids=[episode.trajectory_id],
                trajectory_id=episode.trajectory_id,
                task_id=episode.task_id,
                tools=[],
            )
        )
    return rows
