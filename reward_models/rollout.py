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

from reward_models.conversation import (
    Conversation,
    Message,
    StepTurn,
    build_conversation,
    message_tool_calls,
    policy_view,
)
from reward_models.envs.base import (
    Environment,
    describe_message,
    episode_success,
    message_action,
    prompt_messages,
    reply_messages,
    task_tools,
)
from reward_models.policy.base import Decision, Policy

EnvFactory = Callable[[], Environment]
ProgressCallback = Callable[[int, int], None]


@dataclass
class Step:
    """One turn, verbatim (``message``, ``replies``), with the same turn as people read it and the environment
    played it."""

    observation: str  # the text the agent acted on
    message: Message  # the assistant message as the policy produced it (or as given in a prefix)
    replies: list[Message]  # what came back: tool messages, or the next observation as a user message
    reasoning: str
    action: str  # what the environment did, as text
    text: str  # the assistant text as generated
    reward: float
    done: bool
    logprob: float | None = None
    token_ids: list[int] | None = None  # as generated (see policy.base.Decision); None for prefix or remote steps
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the calls the message makes
    env_action: Any = None  # what `env.step` was given (the oracle replays these)
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
    prompt: list[Message] = field(default_factory=list)  # the messages before the first turn
    tools: list[dict[str, Any]] = field(default_factory=list)
    oracle: OracleSummary | None = None

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def actions(self) -> list[Any]:
        return [step.env_action for step in self.steps]

    def conversation(self) -> Conversation:
        """The episode's chat messages (`reward_models.conversation`)."""
        return build_conversation(self.prompt, [StepTurn(step.message, step.replies) for step in self.steps])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (for a Celery result or a database row)."""
        return asdict(self)


@dataclass
class _Running:
    episode: Episode
    env: Environment
    observation: str
    conversation: Conversation
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
    prefixes: Sequence[Sequence[Message | str]] | None = None,
    render: bool = True,
    max_turns: int = 100,
    progress: ProgressCallback | None = None,
) -> list[Episode]:
    """Run ``samples_per_task`` episodes of every task; returns them task by task, samples in order.

    The policy sees each episode's conversation (through its history window) with the task's tools. ``prefixes``,
    one per task, are assistant messages (or texts) replayed before the policy takes over: an annotator's
    intervention is the original turns up to the corrected one, then the correction. The same arguments and seed
    give the same episodes. ``progress(finished, total)`` is called after every turn. ``max_turns`` caps the
    policy's turns per episode (prefix steps not counted), a guard against an environment that never ends an
    episode; an episode stopped by it is marked ``truncated``.
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
        views = [policy_view(item.conversation, policy.history_window) for item in active]
        tools = [item.episode.tools or None for item in active]
        decisions = policy.act(views, tools=tools, greedy=greedy, temperature=temperature, seed=_turn_seed(seed, turn))
        for item, decision in zip(active, decisions, strict=True):
            _play(item, decision.message, render, decision=decision)
        if progress is not None:
            progress(sum(item.done for item in running), total)

    return [_finish(item) for item in running]


def episode_messages(episode: Episode) -> list[Message]:
    """An episode's chat messages, as the exports write a trajectory's (`reward_models.conversation`)."""
    return episode.conversation().messages


def continue_episode(
    env_factory: EnvFactory,
    task: dict[str, Any],
    prefix: Sequence[Message | str],
    policy: Policy,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    render: bool = True,
    max_turns: int = 100,
) -> Episode:
    """Replay ``prefix`` (assistant messages or texts) on ``task``, then let the policy continue to the end."""
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
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Success rate over the tasks of ``seeds`` (typically ``env.eval_seeds()``), with its standard error.
    ``progress(finished, total)`` is called after every turn, as `rollout` calls it.

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
        progress=progress,
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


def _start(
    env: Environment, task: dict[str, Any], sample_index: int, prefix: Sequence[Message | str], render: bool
) -> _Running:
    first_observation = env.reset(task)
    episode = Episode(
        task=task,
        sample_index=sample_index,
        steps=[],
        final_observation=first_observation,
        total_reward=0.0,
        success=False,
        truncated=False,
        prompt=prompt_messages(env, task, first_observation),
        tools=task_tools(task),
    )
    item = _Running(episode, env, first_observation, build_conversation(episode.prompt, []), False)
    # A prefix copied from a policy's trajectory may hold its garbled turns, which replay as they did.
    for index, turn in enumerate(prefix):
        if item.done:
            raise ValueError(f"prefix turn {index} comes after the episode ended at turn {index - 1}")
        message = {"role": "assistant", "content": turn} if isinstance(turn, str) else turn
        _play(item, message, render, from_prefix=True)
    return item


def _play(
    item: _Running, message: Message, render: bool, *, decision: Decision | None = None, from_prefix: bool = False
) -> None:
    """Give the environment one assistant message and record the turn, verbatim."""
    calls = message_tool_calls(message)
    env_action = message_action(item.env, message)
    result = item.env.step(env_action)
    replies = reply_messages(result)
    reasoning, action = describe_message(item.env, message, calls)
    step = Step(
        observation=item.observation,
        message=message,
        replies=replies,
        reasoning=reasoning,
        action=action,
        text=decision.text if decision is not None else (message.get("content") or ""),
        reward=result.reward,
        done=result.done,
        logprob=decision.logprob if decision is not None else None,
        token_ids=decision.token_ids if decision is not None else None,
        tool_calls=calls,
        env_action=env_action,
        info=result.info,
        render=item.env.render(item.observation) if render else None,
        from_prefix=from_prefix,
    )
    conversation = item.conversation
    conversation.step_starts.append(len(conversation.messages))
    conversation.messages.append(message)
    conversation.messages.extend(replies)
    episode = item.episode
    episode.steps.append(step)
    episode.total_reward += result.reward
    item.observation = result.observation
    episode.final_observation = result.observation
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
