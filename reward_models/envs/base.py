"""The environment protocol every Tandem environment follows, and helpers that work on any of them.

An environment is a stateful, single-episode object: ``reset(task)`` starts an episode and returns the first
observation, ``step(action)`` advances it. Tasks are JSON-safe dicts (they are stored in the database and sent to
workers), holding at least ``{"seed": int, "instruction": str}``; ``make_task(seed)`` builds one.

Success: an environment reports whether the task was accomplished in the final ``StepResult.info["success"]``. Where
it does not, Tandem counts an episode with a positive total reward as a success.

The oracle is hidden information (true return, per-step correctness). Only simulated annotators and evaluation may
read it; the web side never shows it to annotators. Environments without one return ``None`` from ``oracle(task)``.

Chat turns (``reward_models.conversation``): an agent's turn is an assistant message, and an environment may define
how it reads one and what it answers, through three optional methods; `prompt_messages`, `message_action` and
`reply_messages` below call them, or fall back to the text form:

- ``prompt_messages(task, first_observation) -> list[message]``: the conversation before the agent's first turn
  (default: the instruction as the system message, the first observation as the user's);
- ``action_from_message(message) -> action``: what ``step`` is given for an assistant message (default: its text);
- a ``StepResult`` whose ``info["messages"]`` holds the reply messages (tool messages answering the calls); without
  it the reply is the observation as a user message.

An environment whose tasks carry ``"tools"`` (OpenAI tool schemas) offers them to the agent: chat templates get them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Oracle(Protocol):
    """Ground truth about one task. Action lists always start from the task's initial state."""

    def true_return(self, actions: Sequence[str]) -> float:
        """The return the actions earn, replayed from the start (actions past the episode's end are ignored)."""
        ...

    def step_correct(self, actions: Sequence[str]) -> list[bool]:
        """For each step, whether it lies on an optimal path from the state before it."""
        ...

    def best_actions(self, actions_so_far: Sequence[str]) -> list[str]:
        """The optimal actions at the state the prefix reaches; empty once the episode is over."""
        ...

    def success(self, actions: Sequence[str]) -> bool: ...


@runtime_checkable
class Environment(Protocol):
    def make_task(self, seed: int) -> dict[str, Any]:
        """A JSON-safe task: at least ``{"seed": seed, "instruction": str}``."""
        ...

    def eval_seeds(self) -> range:
        """The fixed held-out evaluation seeds. Training, demonstration and annotation tasks never use these."""
        ...

    def reset(self, task: dict[str, Any]) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def legal_actions(self) -> list[str]: ...

    def render(self, observation: str) -> dict[str, Any]:
        """A JSON-safe payload the web UI shows for one step; ``{"kind": "text", "text": ...}`` at the least."""
        ...

    def oracle(self, task: dict[str, Any]) -> Oracle | None: ...


def load_environment(dotted_path: str, config: dict[str, Any] | None = None) -> Environment:
    """Import an environment class by dotted path and construct it with ``**config``.

    >>> env = load_environment("reward_models.envs.gridworld.GridWorld", {"size": 6})
    """
    module_name, _, class_name = dotted_path.rpartition(".")
    if not module_name:
        raise ValueError(f"environment path {dotted_path!r} must be a dotted path like 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"environment path {dotted_path!r}: cannot import module {module_name!r} ({exc})") from exc
    try:
        env_class = getattr(module, class_name)
    except AttributeError:
        raise ValueError(f"environment path {dotted_path!r}: module {module_name!r} has no {class_name!r}") from None
    if not isinstance(env_class, type):
        raise ValueError(f"environment path {dotted_path!r} names {type(env_class).__name__}, not a class")
    try:
        env = env_class(**(config or {}))
    except TypeError as exc:
        raise ValueError(f"environment {dotted_path!r} rejected its config {config!r}: {exc}") from exc
    if not isinstance(env, Environment):
        missing = [name for name in _PROTOCOL_METHODS if not callable(getattr(env, name, None))]
        raise ValueError(f"{dotted_path!r} is not an environment: it lacks {', '.join(missing)}")
    return env


_PROTOCOL_METHODS = ("make_task", "eval_seeds", "reset", "step", "legal_actions", "render", "oracle")


def replay(
    env: Environment, task: dict[str, Any], actions: Sequence[Any], *, strict: bool = True
) -> tuple[str, list[StepResult]]:
    """Reset ``env`` to ``task`` and play ``actions``; returns the first observation and one result per action.

    With ``strict`` (how an annotator's intervention is validated: the original prefix and then the corrected action)
    every action must be among ``legal_actions()`` at its turn, where the environment lists them (an open action
    space lists none). Without it, actions the environment treats as invalid
    are played as the environment plays them, which is how a policy's own garbled turns are reproduced. Either way an
    action after the episode has ended is an error, and ``env`` is left at the state after the last action.
    """
    first_observation = env.reset(task)
    results: list[StepResult] = []
    for index, action in enumerate(actions):
        if results and results[-1].done:
            raise ValueError(f"action {index} ({action!r}) comes after the episode ended at step {index - 1}")
        legal = env.legal_actions() if strict else []
        if legal and action not in legal:
            raise ValueError(f"action {index} ({action!r}) is not legal here; legal: {legal}")
        results.append(env.step(action))
    return first_observation, results


def training_seeds(env: Environment, count: int, start: int = 0) -> Iterator[int]:
    """``count`` seeds from ``start`` upwards, skipping the environment's held-out evaluation seeds."""
    held_out = env.eval_seeds()
    seed = start
    produced = 0
    while produced < count:
        if seed not in held_out:
            yield seed
            produced += 1
        seed += 1


def episode_success(total_reward: float, final_info: dict[str, Any]) -> bool:
    """Whether an episode accomplished its task, by the rule in the module docstring."""
    if "success" in final_info:
        return bool(final_info["success"])
    return total_reward > 0


def prompt_messages(env: Environment, task: dict[str, Any], first_observation: str) -> list[dict[str, Any]]:
    """The messages before the agent's first turn (see the module docstring)."""
    make = getattr(env, "prompt_messages", None)
    if make is not None:
        return make(task, first_observation)
    return [{"role": "system", "content": task["instruction"]}, {"role": "user", "content": first_observation}]


def message_action(env: Environment, message: dict[str, Any]) -> Any:
    """What ``env.step`` is given for an assistant message (see the module docstring). The message's tool calls
    are given as its ``tool_calls`` field, wherever the agent wrote them (a Qwen-style model writes them into its
    text); the message itself is not changed."""
    from reward_models.conversation import message_tool_calls

    calls = message_tool_calls(message)
    if calls and not message.get("tool_calls"):
        message = {**message, "tool_calls": calls}
    read = getattr(env, "action_from_message", None)
    if read is not None:
        return read(message)
    return message.get("content") or ""


def reply_messages(result: StepResult) -> list[dict[str, Any]]:
    """The messages an environment answered a turn with: its tool messages, or the observation as a user message."""
    messages = result.info.get("messages")
    if messages is not None:
        return list(messages)
    return [{"role": "user", "content": result.observation}]


def task_tools(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool schemas a task offers (none for a text environment)."""
    return list(task.get("tools") or [])


def describe_message(env: Environment, message: dict[str, Any], calls: list[dict[str, Any]]) -> tuple[str, str]:
    """``(reasoning, action)``: an assistant turn as the annotator pages show it. An environment may define
    ``describe_message(message)``; by default a turn that calls tools shows its text as the reasoning (without the
    ``<tool_call>`` blocks, where the model wrote its calls into its text) and the calls as the action, and any other
    turn is all action."""
    describe = getattr(env, "describe_message", None)
    if describe is not None:
        return describe(message)
    content = message.get("content") or ""
    if not calls:
        return "", content
    from reward_models.conversation import assistant_text

    if not message.get("tool_calls") and "<tool_call>" in content:
        from reward_models.policy.chat_format import parse_assistant_text

        content = parse_assistant_text(content)["content"]
    return content, assistant_text({"tool_calls": calls})
