"""Batched multi-turn rollouts of a policy in an environment, and success-rate evaluation. No Django, no torch here.

All episodes run in lockstep: each turn makes one batched ``policy.act`` call for every episode still running, which
is what makes hundreds of episodes of a small model cheap. Episodes are independent environment instances made by
``env_factory`` (environments are stateful), e.g.::

    from functools import partial
    episodes = rollout(partial(load_environment, "reward_models.envs.gridworld.GridWorld", {}), tasks, policy)

What the oracle knows about an episode (true return, which steps were correct) is kept in ``Episode.oracle``, apart
from everything else, so the web side can store it without ever showing it to annotators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from reward_models.envs.base import Environment, StepResult, episode_success, replay
from reward_models.policy.base import Policy
from reward_models.policy.turns import Message, Turn, parse_decision, turn_messages

EnvFactory = Callable[[], Environment]
ProgressCallback = Callable[[int, int], None]


@dataclass
class Step:
    observation: str  # what the policy saw before acting
    reasoning: str
    action: str
    text: str  # the full assistant text, as generated (or as given in a prefix)
    reward: float
    done: bool
    logprob: float | None = None
    token_ids: list[int] | None = None  # as generated (see policy.base.Decision); None for prefix or remote steps
    info: dict[str, Any] = field(default_factory=dict)
    render: dict[str, Any] | None = None
    from_prefix: bool = False  # replayed from a given prefix, not generated in this rollout


@dataclass
class OracleSummary:
    true_return: float
    step_correct: list[bool]
    success: bool


@dataclass
class Episode:
    task: dict[str, Any]
    sample_index: int
    steps: list[Step]
    final_observation: str
    total_reward: float
    success: bool
    truncated: bool  # stopped by max_turns while the environment had not ended it
    oracle: OracleSummary | None = None

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def actions(self) -> list[str]:
        return [step.action for step in self.steps]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (for a Celery result or a database row)."""
        return asdict(self)


@dataclass
class _Running:
    episode: Episode
    env: Environment
    observation: str
    history: list[Turn]
    done: bool


def rollout(
    env_factory: EnvFactory,
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    *,
    samples_per_task: int = 1,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    prefixes: Sequence[Sequence[str]] | None = None,
    render: bool = True,
    max_turns: int = 100,
    progress: ProgressCallback | None = None,
) -> list[Episode]:
    """Run ``samples_per_task`` episodes of every task; returns them task by task, samples in order.

    ``prefixes``, one per task, are assistant texts (``"... ; action right"``) or bare actions replayed before the
    policy takes over: an annotator's intervention is the original steps up to the corrected one, then the
    correction. The same arguments and seed give the same episodes. ``progress(finished, total)`` is called after
    every turn. ``max_turns`` caps the policy's turns per episode (prefix steps not counted), a guard against an
    environment that never ends an episode; an episode stopped by it is marked ``truncated``.
    """
    if samples_per_task < 1:
        raise ValueError(f"samples_per_task must be at least 1, got {samples_per_task}")
    if prefixes is not None and len(prefixes) != len(tasks):
        raise ValueError(f"prefixes must have one entry per task ({len(tasks)}), got {len(prefixes)}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")

    running = [
        _start(env_factory(), task, sample_index, prefixes[task_index] if prefixes else (), render)
        for task_index, task in enumerate(tasks)
        for sample_index in range(samples_per_task)
    ]
    total = len(running)
    for turn in range(max_turns):
        active = [item for item in running if not item.done]
        if not active:
            break
        conversations = [
            turn_messages(item.episode.task["instruction"], item.history, item.observation, policy.history_window)
            for item in active
        ]
        decisions = policy.act(conversations, greedy=greedy, temperature=temperature, seed=_turn_seed(seed, turn))
        for item, decision in zip(active, decisions, strict=True):
            result = item.env.step(decision.action)
            step = Step(
                observation=item.observation,
                reasoning=decision.reasoning,
                action=decision.action,
                text=decision.text,
                reward=result.reward,
                done=result.done,
                logprob=decision.logprob,
                token_ids=decision.token_ids,
                info=result.info,
                render=item.env.render(item.observation) if render else None,
            )
            _advance(item, step, result)
        if progress is not None:
            progress(sum(item.done for item in running), total)

    return [_finish(item) for item in running]


def episode_messages(episode: Episode) -> list[Message]:
    """An episode as the exports' trajectory conversation: the instruction, then each step's observation and the
    policy's text; it ends at the last decision, as the preference rows do."""
    messages: list[Message] = [{"role": "system", "content": episode.task["instruction"]}]
    for step in episode.steps:
        messages.append({"role": "user", "content": step.observation})
        messages.append({"role": "assistant", "content": step.text})
    return messages


def continue_episode(
    env_factory: EnvFactory,
    task: dict[str, Any],
    prefix: Sequence[str],
    policy: Policy,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    render: bool = True,
    max_turns: int = 100,
) -> Episode:
    """Replay ``prefix`` (assistant texts or bare actions) on ``task``, then let the policy continue to the end."""
    return rollout(
        env_factory,
        [task],
        policy,
        greedy=greedy,
        temperature=temperature,
        seed=seed,
        prefixes=[prefix],
        render=render,
        max_turns=max_turns,
    )[0]


def evaluate_success(
    policy: Policy,
    env_factory: EnvFactory,
    seeds: Sequence[int],
    *,
    greedy: bool = True,
    samples: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Success rate over the tasks of ``seeds`` (typically ``env.eval_seeds()``), with its standard error.

    With several samples per task the samples of one task are not independent, so the standard error is taken over
    per-task success rates (``task_rates``, in the order of ``seeds``). ``pass_at_k`` is the share of tasks with at
    least one success among the ``samples``.
    """
    env = env_factory()
    tasks = [env.make_task(task_seed) for task_seed in seeds]
    if not tasks:
        raise ValueError("seeds must not be empty")
    episodes = rollout(
        env_factory,
        tasks,
        policy,
        samples_per_task=samples,
        greedy=greedy,
        temperature=temperature,
        seed=seed,
        render=False,
    )
    per_task = [episodes[i * samples : (i + 1) * samples] for i in range(len(tasks))]
    task_rates = [sum(e.success for e in group) / samples for group in per_task]
    mean, stderr = mean_and_stderr(task_rates)
    return {
        "success_rate": mean,
        "stderr": stderr,
        "pass_at_k": sum(any(e.success for e in group) for group in per_task) / len(tasks),
        "mean_length": sum(e.length for e in episodes) / len(episodes),
        "episodes": len(episodes),
        "task_rates": task_rates,
    }


def paired_difference(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """The mean of ``after[i] - before[i]`` and its standard error: two policies scored on the same tasks with the
    same seeds. Pairing removes the spread between easy and hard tasks, so the error of a gain is far smaller than
    the two success rates' own errors would suggest."""
    if len(before) != len(after) or not before:
        raise ValueError("paired_difference needs two equally long, non-empty lists")
    return mean_and_stderr([b - a for a, b in zip(before, after, strict=True)])


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (sample standard deviation over the square root of n)."""
    mean = sum(values) / len(values)
    variance = sum((value - mean) ** 2 for value in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(variance / len(values))


def _turn_seed(seed: int, turn: int) -> int:
    # Distinct turns of distinct rollout seeds must not share a sampling seed; keep it in int64 for torch.
    return (seed * 1_000_003 + turn) % 2**62


def _start(env: Environment, task: dict[str, Any], sample_index: int, prefix: Sequence[str], render: bool) -> _Running:
    decisions = [parse_decision(text) for text in prefix]
    # Not strict: a prefix copied from a policy's trajectory may hold its garbled actions, which replay as they did.
    first_observation, results = replay(env, task, [action for _, action in decisions], strict=False)
    episode = Episode(
        task=task,
        sample_index=sample_index,
        steps=[],
        final_observation=first_observation,
        total_reward=0.0,
        success=False,
        truncated=False,
    )
    item = _Running(episode, env, first_observation, [], False)
    for text, (reasoning, action), result in zip(prefix, decisions, results, strict=True):
        step = Step(
            observation=item.observation,
            reasoning=reasoning,
            action=action,
            text=text,
            reward=result.reward,
            done=result.done,
            info=result.info,
            render=env.render(item.observation) if render else None,
            from_prefix=True,
        )
        _advance(item, step, result)
    return item


def _advance(item: _Running, step: Step, result: StepResult) -> None:
    item.episode.steps.append(step)
    item.episode.total_reward += result.reward
    item.history.append(Turn(observation=item.observation, response=step.text))
    item.observation = result.observation
    item.episode.final_observation = result.observation
    item.done = result.done


def _finish(item: _Running) -> Episode:
    episode = item.episode
    episode.truncated = not item.done
    episode.success = episode_success(episode.total_reward, episode.steps[-1].info if episode.steps else {})
    oracle = item.env.oracle(episode.task)
    if oracle is not None:
        episode.oracle = OracleSummary(
            true_return=oracle.true_return(episode.actions),
            step_correct=oracle.step_correct(episode.actions),
            success=oracle.success(episode.actions),
        )
    return episode
