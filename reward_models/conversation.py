"""A trajectory as chat messages: the one function every consumer uses (rollouts, imports, exports, judges, trainers).

A trajectory is stored verbatim, turn by turn. Its ``prompt`` is the messages before the agent's first turn (a
system message, the user's request or the first observation). Each step then holds the assistant message the agent
produced, exactly as produced (``content``, and OpenAI-style ``tool_calls`` where the agent wrote them as a field),
and the ``replies`` that came back (tool messages answering its calls, or a user message with the next observation).
The conversation is the prompt, then each step's message and replies, in order::

    [system, user]  +  [assistant_0, *replies_0]  +  [assistant_1, *replies_1]  + ...

Nothing here parses or rebuilds a turn: a local model's assistant message is the text it generated (its
``<tool_call>`` markup included), an endpoint's or an import's is the message as it came. ``Conversation`` knows
where each step's assistant message sits, which is what step-level rows (a prefix and one step's continuation) and
per-step scores need.

No Django, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True)
class StepTurn:
    """One step of a trajectory: what the agent produced and what came back."""

    message: Message
    replies: Sequence[Message] = ()


@dataclass
class Conversation:
    """A trajectory's messages, with the position of each step's assistant message.

    ``messages[:prompt_length]`` is the prompt; ``messages[step_starts[i]]`` is step ``i``'s assistant message, and
    its replies run up to ``step_starts[i + 1]`` (or the end).
    """

    messages: list[Message]
    prompt_length: int
    step_starts: list[int] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.step_starts)

    @property
    def prompt(self) -> list[Message]:
        return self.messages[: self.prompt_length]

    def before_step(self, step: int) -> list[Message]:
        """Every message before step ``step``'s assistant message: the context the agent acted on."""
        return self.messages[: self.step_starts[step]]

    def step_end(self, step: int) -> int:
        """The position just after step ``step``'s replies."""
        return self.step_starts[step + 1] if step + 1 < self.num_steps else len(self.messages)

    def through_step(self, step: int, *, replies: bool = True) -> list[Message]:
        """The messages up to step ``step``'s assistant message, and its replies too unless ``replies`` is False."""
        return self.messages[: self.step_end(step) if replies else self.step_starts[step] + 1]

    def assistant(self, step: int) -> Message:
        return self.messages[self.step_starts[step]]


def build_conversation(prompt: Sequence[Message], steps: Iterable[StepTurn]) -> Conversation:
    """The conversation of a trajectory: its prompt, then each step's assistant message and replies."""
    messages = [dict(message) for message in prompt]
    prompt_length = len(messages)
    starts = []
    for step in steps:
        starts.append(len(messages))
        messages.append(dict(step.message))
        messages.extend(dict(reply) for reply in step.replies)
    return Conversation(messages, prompt_length, starts)


def trajectory_messages(prompt: Sequence[Message], steps: Iterable[StepTurn]) -> list[Message]:
    """``build_conversation(prompt, steps).messages``."""
    return build_conversation(prompt, steps).messages


def split_conversation(messages: Sequence[Message]) -> tuple[list[Message], list[StepTurn]]:
    """The inverse of `trajectory_messages` for a transcript as agent frameworks write it: the messages before the
    first assistant message are the prompt, and each assistant message starts a step whose replies are the messages
    up to the next assistant message. ``trajectory_messages(*split_conversation(m)) == m`` for any ``m``."""
    prompt: list[Message] = []
    steps: list[StepTurn] = []
    for message in messages:
        if message.get("role") == "assistant":
            steps.append(StepTurn(dict(message), []))
        elif steps:
            steps[-1].replies.append(dict(message))  # type: ignore[attr-defined]
        else:
            prompt.append(dict(message))
    return prompt, [StepTurn(step.message, list(step.replies)) for step in steps]


def assistant_text(message: Message) -> str:
    """The text of an assistant message for people and plain-text judges: its content, then each tool call as
    ``name(arguments)`` on a line of its own (the arguments as the agent wrote them)."""
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        parts.append(f"{function.get('name', '')}({arguments})")
    return "\n".join(part for part in parts if part)


def reply_text(replies: Sequence[Message]) -> str:
    """What came back after a step, as text: each reply's content, a tool's prefixed with its name."""
    lines = []
    for reply in replies:
        content = reply.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        name = reply.get("name")
        lines.append(f"[{name}] {content}" if reply.get("role") == "tool" and name else content)
    return "\n".join(lines)


def message_tool_calls(message: Message) -> list[dict[str, Any]]:
    """The tool calls an assistant message makes, OpenAI-shaped: its ``tool_calls`` field where it has one (an
    endpoint's or an import's message), else the ``<tool_call>`` blocks of its text (how Qwen-style models write
    them, read by `reward_models.policy.chat_format.parse_assistant_text`); none for a plain answer."""
    if message.get("tool_calls"):
        return list(message["tool_calls"])
    content = message.get("content")
    if isinstance(content, str) and "<tool_call>" in content:
        from reward_models.policy.chat_format import parse_assistant_text

        return parse_assistant_text(content)["tool_calls"]
    return []


def policy_view(conversation: Conversation, history_window: int | None) -> list[Message]:
    """What a policy with a history window of ``history_window`` past turns is shown before its next turn: the
    conversation's leading system messages, then the last ``history_window`` turns with what the agent saw before
    each, then what it sees now. ``None`` shows everything. With a window of 0 a gridworld policy sees the
    instruction and the current map only."""
    if history_window is None:
        return list(conversation.messages)
    if history_window < 0:
        raise ValueError(f"history_window must be None or >= 0, got {history_window}")
    leading = 0
    while leading < conversation.prompt_length and conversation.messages[leading].get("role") == "system":
        leading += 1
    first_shown = max(0, conversation.num_steps - history_window)
    start = conversation.step_starts[first_shown - 1] + 1 if first_shown > 0 else leading
    return [*conversation.messages[:leading], *conversation.messages[start:]]
