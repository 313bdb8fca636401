"""Scripted and on-policy gridworld episodes with everything the hidden oracle knows about them, with no Django.

An episode is a conversation as `reward_models.conversation` builds one (the environment's prompt, then each step's
assistant message and the observation that came back, the final one included), with the oracle's facts: whether it
succeeded, which steps were correct, its graded return. `simulation.oracle_data` makes training rows of them, and
`oracle_correction` and `critique_text` are what an oracle annotator writes about one.

The demonstrator of `scripted_episodes` is the bootstrap's: its reasoning states the true offset to the goal, and its
action is a shortest-path move except that, with probability ``noise``, it is uniformly random. Mixing noise levels
gives successes and failures of every length on the same task.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from reward_models.conversation import Conversation, Message, StepTurn, build_conversation
from reward_models.envs.base import prompt_messages, reply_messages, training_seeds
from reward_models.envs.gridworld import ACTIONS, GridWorld
from reward_models.policy.bootstrap import goal_reasoning

PAIR_TYPES = ("both_succeeded", "one_succeeded", "both_failed")


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


def skilled_walk(env: GridWorld, task: dict[str, Any], rng: random.Random, skill: float) -> list[tuple]:
    """A gridworld episode played as it goes, the way a player of some `skill` would: at each step the oracle's
    best move with probability `skill`, else a uniformly random one, until the episode ends or the oracle has no
    move left. One ``(index, observation, action, on_course, result)`` per step: the observation the step acted on,
    whether the action was one of the oracle's best, and what `env.step` returned."""
    oracle = env.oracle(task)
    observation, actions, steps = env.reset(task), [], []
    for index in range(env.max_steps):
        best = oracle.best_actions(actions)
        if not best:
            break
        action = best[0] if rng.random() < skill else rng.choice(ACTIONS)
        result = env.step(action)
        steps.append((index, observation, action, action in best, result))
        actions.append(action)
        observation = result.observation
        if result.done:
            break
    return steps


def pair_type(a: OracleEpisode, b: OracleEpisode) -> str:
    return PAIR_TYPES[2 - (a.success + b.success)]


def oracle_pairs(episodes: Sequence[OracleEpisode]) -> list[tuple[OracleEpisode, OracleEpisode]]:
    """Every pair of episodes of the same task, in a stable order."""
    by_task: dict[int, list[OracleEpisode]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task_id, []).append(episode)
    return [pair for task in sorted(by_task) for pair in combinations(by_task[task], 2)]


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
