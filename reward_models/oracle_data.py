"""Gridworld episodes labelled by the hidden oracle, in the layouts of Tandem's exports, with no Django.

The judge-model pipelines train on exported snapshots. This module makes rows in exactly those layouts from scripted
gridworld episodes, labelled the way a B-Pref scripted teacher would label them, so that the pipelines can be
tested, benchmarked and held against the oracle without a database:

- `preference_rows`: pairs within a task, preferred by the oracle's `progress_return` (a success beats a failure, a
  shorter success beats a longer one, and of two failures the one that ended nearer the goal wins), through
  P(a > b) = sigmoid(beta * (R_a - R_b)) with a mistake rate `epsilon`; differences within `equal_threshold` are ties.
- `stepwise_rows`: PRM800K-style step labels from the oracle's per-step correctness (a step is good when it brings
  the agent nearer the goal), flipped with probability `epsilon`; `intervention_rows` are the RLIF-style labels an
  intervention at the first wrong step implies.
- `returns_rows`: the environment's per-step rewards, for the value critic.
- `critique_rows`: template critiques that name the first wrong step.

An episode is a conversation as `reward_models.conversation` builds one (the environment's prompt, then each step's
assistant message and the observation that came back, the final one included), and every row is cut from it the way
the exports cut a trajectory's conversation: preference and unpaired rows split it after the prompt, step rows before
a step's assistant message, stepwise rows after each step's assistant message. Conversational rows carry the
``tools`` column (none for the gridworld).

The demonstrator is the bootstrap's: its reasoning states the true offset to the goal, and its action is a
shortest-path move except that, with probability ``noise``, it is uniformly random. Mixing noise levels gives
successes and failures of every length on the same task.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from reward_models.conversation import Conversation, Message, StepTurn, build_conversation
from reward_models.envs.base import prompt_messages, reply_messages, training_seeds
from reward_models.envs.gridworld import ACTIONS, GridWorld
from reward_models.policy.bootstrap import goal_reasoning
from reward_models.policy.turns import message_steps, parse_decision, text_pair, text_steps, transcript

PAIR_TYPES = ("both_succeeded", "one_succeeded", "both_failed")
CRITIQUE_REQUEST = "Critique this trajectory."
# Strength by the size of the oracle difference, mapped to the exports' margins (strength 1, 2, 3 -> 0, 0.5, 1).
MARGIN_BY_DIFFERENCE = ((0.5, 1.0), (0.2, 0.5), (0.0, 0.0))


@dataclass
class OracleEpisode:
    """One scripted episode and everything the oracle knows about it. `conversation` is the trajectory as the
    exports read it: the prompt (the instruction and the first observation), then each step's decision (assistant)
    and the observation it led to (user), the last one `final_observation`."""

    trajectory_id: int
    task_id: int
    noise: float
    conversation: Conversation
    actions: list[str]
    rewards: list[float]
    success: bool
    step_correct: list[bool]
    score: float
    env_config: dict[str, Any] = field(default_factory=dict)
    final_observation: str = ""

    @property
    def messages(self) -> list[Message]:
        return self.conversation.messages

    @property
    def prompt(self) -> list[Message]:
        return self.conversation.prompt

    @property
    def first_error(self) -> int | None:
        return next((index for index, correct in enumerate(self.step_correct) if not correct), None)

    def observation(self, step: int) -> str:
        """What the agent saw when it took step `step`."""
        return self.messages[self.conversation.step_starts[step] - 1]["content"]


def scripted_episodes(
    n_tasks: int,
    per_task: int = 2,
    noises: Sequence[float] = (0.1, 0.4, 0.8),
    seed: int = 0,
    *,
    seeds: Iterable[int] | None = None,
    env_config: dict[str, Any] | None = None,
) -> list[OracleEpisode]:
    """`per_task` episodes on each of `n_tasks` tasks (training seeds, or the given `seeds`, e.g. the environment's
    held-out `eval_seeds()`), each with a noise level drawn from `noises`. Deterministic for the same arguments."""
    env = GridWorld(**(env_config or {}))
    rng = random.Random(seed)
    task_seeds = list(seeds)[:n_tasks] if seeds is not None else list(training_seeds(env, n_tasks))
    episodes = []
    for task_seed in task_seeds:
        task = env.make_task(task_seed)
        oracle = env.oracle(task)
        for _ in range(per_task):
            noise = rng.choice(list(noises))
            observation = env.reset(task)
            prompt = prompt_messages(env, task, observation)
            steps: list[StepTurn] = []
            actions, rewards, done = [], [], False
            while not done:
                best = oracle.best_actions(actions)
                action = rng.choice(ACTIONS) if rng.random() < noise or not best else rng.choice(best)
                message = env.message_for_action(action, goal_reasoning(observation))
                result = env.step(action)
                steps.append(StepTurn(message, reply_messages(result)))
                actions.append(action)
                rewards.append(result.reward)
                observation, done = result.observation, result.done
            episodes.append(
                OracleEpisode(
                    trajectory_id=len(episodes) + 1,
                    task_id=task_seed,
                    noise=noise,
                    conversation=build_conversation(prompt, steps),
                    actions=actions,
                    rewards=rewards,
                    success=oracle.success(actions),
                    step_correct=oracle.step_correct(actions),
                    score=oracle.progress_return(actions),
                    env_config=dict(env_config or {}),
                    final_observation=observation,
                )
            )
    return episodes


def pair_type(a: OracleEpisode, b: OracleEpisode) -> str:
    return PAIR_TYPES[2 - (a.success + b.success)]


def oracle_pairs(episodes: Sequence[OracleEpisode]) -> list[tuple[OracleEpisode, OracleEpisode]]:
    """Every pair of episodes of the same task, in a stable order."""
    by_task: dict[int, list[OracleEpisode]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task_id, []).append(episode)
    return [pair for task in sorted(by_task) for pair in combinations(by_task[task], 2)]


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
        margin = 0.0 if tie else next(m for bound, m in MARGIN_BY_DIFFERENCE if abs(difference) > bound)
        cut = chosen.conversation.prompt_length
        prompt, chosen_part, rejected_part = chosen.messages[:cut], chosen.messages[cut:], rejected.messages[cut:]
        if style == "text":
            prompt_text, chosen_part = text_pair(prompt, chosen_part)
            _, rejected_part = text_pair(prompt, rejected_part)
            prompt = prompt_text
        rows.append(
            {
                "prompt": prompt,
                "chosen": chosen_part,
                "rejected": rejected_part,
                "margin": margin,
                "agreement": 1.0,
                "rationale": "",
                "annotator_ids": [0],
                "label_ids": [len(rows) + 1],
                "task_id": a.task_id,
                "chosen_trajectory_id": chosen.trajectory_id,
                "rejected_trajectory_id": rejected.trajectory_id,
                "tie": tie,
                "pair_type": pair_type(a, b),
                "oracle_preferred": chosen.score > rejected.score,
                **_tools(style),
            }
        )
    return rows


def _tools(style: str) -> dict[str, Any]:
    """The ``tools`` column of a conversational row: the gridworld offers none."""
    return {"tools": []} if style == "conversational" else {}


def episode_steps(episode: OracleEpisode, style: str) -> tuple[Any, list[Any]]:
    """The prompt and one piece per step of an episode, as the stepwise and returns exports lay them out:
    conversational (`turns.message_steps`) or text (`turns.text_steps`)."""
    if style not in ("conversational", "text"):
        raise ValueError(f"style must be 'conversational' or 'text', got {style!r}")
    return message_steps(episode.messages) if style == "conversational" else text_steps(episode.messages)


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
    return {
        "prompt": prompt,
        "completions": pieces,
        "labels": labels,
        "step_indices": list(range(len(pieces))),
        "agreement": 1.0,
        "annotator_ids": [0],
        "label_ids": [episode.trajectory_id],
        "trajectory_id": episode.trajectory_id,
        "task_id": episode.task_id,
        "source": source,
        "oracle_labels": episode.step_correct[: len(pieces)],
        **_tools(style),
    }


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
            {
                "prompt": prompt,
                "completions": pieces,
                "rewards": list(episode.rewards) if with_rewards else None,
                "success": episode.success if with_rewards else None,
                "trajectory_id": episode.trajectory_id,
                "task_id": episode.task_id,
                "policy_version_id": None,
                **_tools(style),
            }
        )
    return rows


def critique_text(episode: OracleEpisode) -> str:
    """The template critique: the first wrong step and what it should have done, or praise for a clean run."""
    error = episode.first_error
    if error is None:
        return (
            "every step moves toward the goal ; the agent reaches the goal"
            if episode.success
            else ("every step moves toward the goal but the agent runs out of steps")
        )
    env = GridWorld(**episode.env_config)
    best = " or ".join(env.oracle(env.make_task(episode.task_id)).best_actions(episode.actions[:error]))
    return f"step {error + 1} is wrong : {episode.actions[error]} moves away from the goal ; {best} was better"


def critique_rows(episodes: Sequence[OracleEpisode], *, style: str = "conversational") -> list[dict[str, Any]]:
    """One whole-trajectory critique per episode, laid out as the `critiques` export writes them."""
    rows = []
    for episode in episodes:
        request = f"{transcript(episode.messages)}\n\n{CRITIQUE_REQUEST}"
        prompt: Any = [{"role": "user", "content": request}]
        completion: Any = [{"role": "assistant", "content": critique_text(episode)}]
        if style == "text":
            prompt, completion = text_pair(prompt, completion)
        rows.append(
            {
                "prompt": prompt,
                "completion": completion,
                "trajectory_id": episode.trajectory_id,
                "task_id": episode.task_id,
                "step_index": None,
                "span_field": "",
                "span_start": None,
                "span_end": None,
                "span_text": "",
                "tags": [],
                "annotator_ids": [0],
                "label_ids": [episode.trajectory_id],
            }
        )
    return rows


def vocabulary() -> list[str]:
    """Every word these rows hold beyond the gridworld policy's own (transcript roles, the critique request and
    templates), for building a word tokenizer that covers them."""
    return [
        "System: User: Assistant:",
        CRITIQUE_REQUEST,
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


def build_tiny_base(
    path: str | Path,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 64,
    max_positions: int = 2048,
    seed: int = 0,
) -> Path:
    """An untrained tiny Llama directory whose word tokenizer covers every word of these rows (gridworld turns,
    transcript roles, critique templates): a base model for judge pipelines on oracle data, built offline."""
    from reward_models.policy.bootstrap import vocabulary_corpus
    from reward_models.policy.model import build_tiny_llama, save_policy
    from reward_models.policy.tokenizer import build_word_tokenizer

    tokenizer = build_word_tokenizer([*vocabulary_corpus(GridWorld()), *vocabulary()])
    model = build_tiny_llama(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
        seed=seed,
    )
    return save_policy(model, tokenizer, path, history_window=0, max_new_tokens=32)


# --- the policy's own rollouts, and what an oracle annotator says about them (policy trainers) -----------------------


def policy_episodes(
    policy: Any,
    n_tasks: int,
    *,
    samples_per_task: int = 1,
    greedy: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    start: int = 0,
    env_config: dict[str, Any] | None = None,
) -> list[OracleEpisode]:
    """`samples_per_task` rollouts of `policy` (any `reward_models.policy.base.Policy`) on each of `n_tasks`
    training tasks from seed `start` up (never a held-out one), with what the oracle knows about each: the on-policy
    episodes that interventions, ratings and corrections are given on. `noise` is -1: the mistakes are the policy's
    own. Deterministic for the same policy and arguments."""
    from functools import partial

    from reward_models.rollout import rollout

    env = GridWorld(**(env_config or {}))
    tasks = [env.make_task(task_seed) for task_seed in training_seeds(env, n_tasks, start)]
    factory = partial(GridWorld, **(env_config or {}))
    rolled = rollout(
        factory,
        tasks,
        policy,
        samples_per_task=samples_per_task,
        greedy=greedy,
        temperature=temperature,
        seed=seed,
        render=False,
        max_turns=env.max_steps,
    )
    episodes = []
    for number, episode in enumerate(rolled, start=1):
        oracle = env.oracle(episode.task)
        episodes.append(
            OracleEpisode(
                trajectory_id=number,
                task_id=episode.task["seed"],
                noise=-1.0,
                conversation=episode.conversation(),
                actions=episode.actions,
                rewards=[step.reward for step in episode.steps],
                success=oracle.success(episode.actions),
                step_correct=oracle.step_correct(episode.actions),
                score=oracle.progress_return(episode.actions),
                env_config=dict(env_config or {}),
                final_observation=episode.final_observation,
            )
        )
    return episodes


def oracle_correction(episode: OracleEpisode, step: int, rng: random.Random, epsilon: float = 0.0) -> Message:
    """The assistant message an oracle annotator writes when correcting `step`: the demonstrator's reasoning for
    that step's observation and one of the shortest-path moves from there (drawn with `rng` when several are). With
    probability `epsilon` the annotator errs and writes one of the other moves instead (not the policy's own), as
    the other simulated annotators flip their labels."""
    from reward_models.envs.gridworld import ACTIONS

    env = GridWorld(**episode.env_config)
    best = env.oracle(env.make_task(episode.task_id)).best_actions(episode.actions[:step])
    # A wrong correction is another move than the policy's own, or it would be no intervention at all.
    worse = [action for action in ACTIONS if action not in best and action != episode.actions[step]]
    mistaken = epsilon > 0 and rng.random() < epsilon
    move = rng.choice(worse if mistaken and worse else best)
    return env.message_for_action(move, goal_reasoning(episode.observation(step)))


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
        rows.append(
            {
                "prompt": episode.conversation.before_step(error),
                "chosen": [corrected],
                "rejected": [dict(original)],
                "margin": 1.0,
                "agreement": 1.0,
                "rationale": "",
                "annotator_ids": [0],
                "label_ids": [len(rows) + 1],
                "source": "intervention",
                "step_index": error,
                "task_id": episode.task_id,
                "chosen_trajectory_id": None,
                "rejected_trajectory_id": episode.trajectory_id,
                "tools": [],
                "chosen_action": parse_decision(corrected["content"])[1],
                "rejected_action": episode.actions[error],
            }
        )
    return rows


def intervention_sft_rows(
    episodes: Sequence[OracleEpisode], *, seed: int = 0, epsilon: float = 0.0
) -> list[dict[str, Any]]:
    """`sft` rows for the same interventions as `intervention_step_preference_rows` (the same seed and `epsilon`
    draw the same corrections): the conversation before the first wrong step, then the correction."""
    rows = []
    for pair in intervention_step_preference_rows(episodes, seed=seed, epsilon=epsilon):
        rows.append(
            {
                "messages": [*pair["prompt"], *pair["chosen"]],
                "tools": [],
                "source": "intervention",
                "step_index": pair["step_index"],
                "annotator_ids": [0],
                "label_ids": pair["label_ids"],
                "trajectory_id": pair["rejected_trajectory_id"],
                "task_id": pair["task_id"],
            }
        )
    return rows


def unpaired_rows(episodes: Sequence[OracleEpisode], *, epsilon: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """`unpaired` (KTO) rows: one thumb per episode, up for a success and down for a failure, flipped with
    probability `epsilon`; the prompt is the trajectory's prompt, the completion the rest of its conversation."""
    rng = random.Random(seed)
    rows = []
    for episode in episodes:
        if not episode.conversation.num_steps:
            continue
        cut = episode.conversation.prompt_length
        rows.append(
            {
                "prompt": episode.messages[:cut],
                "completion": episode.messages[cut:],
                "label": episode.success != (rng.random() < epsilon),
                "agreement": 1.0,
                "annotator_ids": [0],
                "label_ids": [episode.trajectory_id],
                "trajectory_id": episode.trajectory_id,
                "task_id": episode.task_id,
                "tools": [],
            }
        )
    return rows
