"""How a trajectory becomes model input, one turn at a time. Every policy, rollout and trainer goes through here.

A trajectory is a conversation (`reward_models.conversation`): the prompt, then each step's assistant message and the
replies that came back (tool messages, or the next observation as a user message). A policy acts on the view of the
conversation its history window shows (`conversation.policy_view`), rendered by its chat template with the task's
tools (`render_prompt`), and writes the next assistant message. ``encode_turns`` turns one such turn into prompt token
ids and completion token ids, separately, which is what PPO (per-turn logprobs and values), step-level DPO, KTO and
SFT (loss on the completion only: observations and tool results are prompt tokens) need. Keeping both in this one
module is what guarantees that trainers score exactly the tokens the rollout generated.

The built-in gridworld's turns are written as a short reasoning and then the action
(``goal is down 2 right 3 ; action right``, `format_decision`); a tool-calling model's turn is the text it generated,
``<tool_call>`` markup included, or an assistant message with OpenAI-style ``tool_calls``.

History window: ``history_window`` previous turns are shown before the current observation (``None``: all of them).
The built-in tiny policy uses 0, i.e. it sees only the instruction and the current observation. The gridworld is
fully observed, so the current map is a Markov state and nothing is lost, while sequences stay ~60 tokens instead of
growing by ~55 tokens a turn. A policy whose environment is partially observed wants a window > 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reward_models.conversation import Conversation, Message, assistant_text, policy_view, reply_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


_ACTION_MARKER = re.compile(r"\baction\b\s*[:=]?", re.IGNORECASE)
_ACTION_QUOTES = "`'\"*. "


@dataclass
class Turn:
    """One completed turn of the history: what the policy saw and what it wrote (the full assistant text)."""

    observation: str
    response: str


@dataclass
class TurnEncoding:
    prompt_ids: list[int]
    completion_ids: list[int]


def format_decision(reasoning: str, action: str) -> str:
    """The assistant text for a decision; ``parse_decision`` inverts it."""
    reasoning = reasoning.strip()
    return f"{reasoning} ; action {action}" if reasoning else f"action {action}"


def parse_decision(text: str) -> tuple[str, str]:
    """Split an assistant text into ``(reasoning, action)``.

    The action is what follows the last word ``action`` (an optional ``:`` or ``=`` after it), up to the end of that
    line, without surrounding quotes, backticks or a final full stop; the reasoning is everything before it. Text with
    no ``action`` marker is taken as a bare action, as generated, with empty reasoning: a model that just answers
    ``right`` still moves, and garbage reaches the environment unchanged, which treats it as an invalid action (the
    gridworld: a no-op that costs a step). Nothing here raises, because a policy's output is never trusted.

    >>> parse_decision("goal is down 2 right 3 ; action right")
    ('goal is down 2 right 3', 'right')
    """
    markers = list(_ACTION_MARKER.finditer(text))
    if not markers:
        return "", text.strip()
    last = markers[-1]
    action_line = text[last.end() :].strip().split("\n", 1)[0]
    reasoning = text[: last.start()].strip().rstrip(";").strip()
    return reasoning, action_line.strip(_ACTION_QUOTES)


def turn_messages(
    instruction: str, history: Sequence[Turn], observation: str, history_window: int | None
) -> list[Message]:
    """The conversation a policy sees before acting on ``observation``.

    >>> turn_messages("reach the goal G", [], ". A | G .", history_window=0)[-1]
    {'role': 'user', 'content': '. A | G .'}
    """
    if history_window is not None and history_window < 0:
        raise ValueError(f"history_window must be None or >= 0, got {history_window}")
    if history_window is None:
        shown = history
    else:
        # history[-0:] would be the whole history, so a window of 0 is spelled out.
        shown = history[max(0, len(history) - history_window) :] if history_window else []
    messages: list[Message] = [{"role": "system", "content": instruction}]
    for turn in shown:
        messages.append({"role": "user", "content": turn.observation})
        messages.append({"role": "assistant", "content": turn.response})
    messages.append({"role": "user", "content": observation})
    return messages


def turn_views(
    conversation: Conversation, history_window: int | None, start: int = 0, stop: int | None = None
) -> tuple[list[list[Message]], list[Message]]:
    """For each step from `start` up to `stop` (default: the last), what the policy was shown before it (the
    conversation so far through its history window, `conversation.policy_view`, as the rollout showed it) and the
    assistant message it wrote."""
    stop = conversation.num_steps if stop is None else stop
    views, messages = [], []
    for step in range(start, stop):
        before = Conversation(
            conversation.before_step(step), conversation.prompt_length, conversation.step_starts[:step]
        )
        views.append(policy_view(before, history_window))
        messages.append(conversation.assistant(step))
    return views, messages


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase,
    conversation: Conversation,
    tools: Sequence[dict] | None,
    history_window: int | None,
    start: int = 0,
    stop: int | None = None,
    *,
    max_prompt_tokens: int = 0,
) -> list[TurnEncoding]:
    """`encode_turns` of the steps `start` to `stop` of a trajectory conversation, each as the policy saw and wrote
    it: the prompt rendered with the task's `tools` (cut to `max_prompt_tokens` as `cut_prompt` cuts it, when that
    is set), the completion its assistant message. Observations and tool results are always prompt tokens, so a
    trainer's loss on the completions is on the assistant's own tokens only."""
    views, messages = turn_views(conversation, history_window, start, stop)
    return encode_turns(tokenizer, views, messages, [tools] * len(views), max_prompt_tokens=max_prompt_tokens)


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], tools: Sequence[dict] | None = None
) -> str:
    """The prompt text ending where the assistant's answer starts.

    Uses the tokenizer's chat template, which is always given the task's ``tools``; a base model without one gets a
    plain ``Role: content`` transcript.
    """
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, tokenize=False, add_generation_prompt=True
        )
    return transcript(messages) + "\nAssistant:"


def encode_turn(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    completion: str | Message,
    tools: Sequence[dict] | None = None,
) -> TurnEncoding:
    """Prompt and completion token ids for one turn, exactly as the policy generates them.

    The prompt is ``render_prompt(tokenizer, messages, tools)``; the completion (an assistant message, or its text)
    is tokenized on its own (`completion_text`) and closed with the end-of-sequence token, the way ``generate``
    produced it after the prompt, rather than cut out of a tokenized full conversation (for BPE tokenizers the two
    differ at the seam).
    """
    return encode_turns(tokenizer, [messages], [completion], [tools])[0]


def encode_turns(
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Sequence[Message]],
    completions: Sequence[str | Message],
    tools: Sequence[Sequence[dict] | None] | None = None,
    *,
    max_prompt_tokens: int = 0,
) -> list[TurnEncoding]:
    """``encode_turn`` for many turns at once (one batched tokenizer call each for prompts and completions);
    ``tools`` holds one list of tool schemas (or None) per conversation. With `max_prompt_tokens`, each prompt is
    cut to that many tokens by `cut_prompt`."""
    if len(conversations) != len(completions):
        raise ValueError(f"got {len(conversations)} conversations but {len(completions)} completions")
    tools = tools if tools is not None else [None] * len(conversations)
    prompts = [
        render_prompt(tokenizer, messages, offered) for messages, offered in zip(conversations, tools, strict=True)
    ]
    texts = [
        completion_text(tokenizer, messages, completion, offered, prompt=prompt)
        for messages, completion, offered, prompt in zip(conversations, completions, tools, prompts, strict=True)
    ]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens:
        prompt_ids = [
            cut_prompt(tokenizer, messages, offered, ids, max_prompt_tokens)
            for messages, offered, ids in zip(conversations, tools, prompt_ids, strict=True)
        ]
    completion_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [
        TurnEncoding(prompt_ids=prompt, completion_ids=completion + [tokenizer.eos_token_id])
        for prompt, completion in zip(prompt_ids, completion_ids, strict=True)
    ]


def cut_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[dict] | None,
    prompt_ids: list[int],
    max_tokens: int,
) -> list[int]:
    """A rendered prompt's token ids (`prompt_ids`, of ``render_prompt(tokenizer, messages, tools)``) in at most
    `max_tokens` tokens: whole when they fit, otherwise the leading system turn (with the tools the template writes
    into it) and then the most recent tokens, cut from the left. A long conversation loses its oldest turns first,
    and the system turn and the end of the prompt, where the assistant's answer starts, stay. Generation and the
    trainers' encodings cut alike, so a trainer scores the prompt the policy was given."""
    if not max_tokens or len(prompt_ids) <= max_tokens:
        return list(prompt_ids)
    head = _system_turn_tokens(tokenizer, messages, tools, prompt_ids)
    head = head if head < max_tokens else 0
    return list(prompt_ids[:head]) + list(prompt_ids[len(prompt_ids) - (max_tokens - head) :])


def _system_turn_tokens(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[dict] | None,
    prompt_ids: list[int],
) -> int:
    """How many of `prompt_ids` render the conversation's leading system messages (0 without any, or when the
    template does not render them as a prefix of the prompt)."""
    leading = 0
    while leading < len(messages) and messages[leading].get("role") == "system":
        leading += 1
    if not leading:
        return 0
    if tokenizer.chat_template:
        offered = list(tools) if tools else None
        text = tokenizer.apply_chat_template(list(messages[:leading]), tools=offered, tokenize=False)
    else:
        text = transcript(messages[:leading])
    head = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(head) if list(prompt_ids[: len(head)]) == head else 0


def completion_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    completion: str | Message,
    tools: Sequence[dict] | None = None,
    *,
    prompt: str | None = None,
) -> str:
    """The text a policy writes for the assistant turn `completion` after ``render_prompt(tokenizer, messages,
    tools)`` (given as `prompt` when the caller has it), without the end of turn (`encode_turns` closes it with the
    end-of-sequence token, as generation does).

    A text, or a message without a ``tool_calls`` field, is its content: a local model's turn is exactly the text
    it generated, tool-call markup included. A message with ``tool_calls`` (an endpoint's or an import's turn, an
    annotator's correction) is what the chat template renders for it after the prompt, up to the template's
    end-of-sequence token, so the policy is trained on its own way of writing tool calls. Without a chat template
    the turn follows ``Assistant:`` as the transcript writes it.
    """
    message = {"role": "assistant", "content": completion} if isinstance(completion, str) else completion
    if not tokenizer.chat_template:
        # Plain-transcript prompts end in "Assistant:" and the answer follows after a space.
        return " " + _message_text(message)
    if not message.get("tool_calls"):
        return message.get("content") or ""
    prompt = prompt if prompt is not None else render_prompt(tokenizer, messages, tools)
    whole = tokenizer.apply_chat_template([*messages, message], tools=list(tools) if tools else None, tokenize=False)
    if not whole.startswith(prompt):
        raise ValueError("the chat template renders the conversation before this turn differently once it is answered")
    rendered = whole[len(prompt) :]
    end = rendered.rfind(tokenizer.eos_token) if tokenizer.eos_token else -1
    return rendered[:end] if end >= 0 else rendered.rstrip()


# --- plain-text transcripts (the `text` style of Tandem's exports) ----------------------------------------------


def transcript(messages: Sequence[Message]) -> str:
    """The plain-text transcript of `messages`, one ``Role: content`` line each (``render_prompt``'s form); an
    assistant's tool calls follow its content as ``name(arguments)``, and a tool's reply is prefixed with its name."""
    return "\n".join(f"{message['role'].capitalize()}: {_message_text(message)}" for message in messages)


def _message_text(message: Message) -> str:
    if message.get("tool_calls"):
        return assistant_text(message)
    if message.get("role") == "tool":
        return reply_text([message])
    return message.get("content") or ""


def text_pair(prompt: Sequence[Message], completion: Sequence[Message]) -> tuple[str, str]:
    """The text prompt (ending where the assistant's answer starts, as ``render_prompt`` ends it) and the text
    completion; their concatenation is the transcript of the whole conversation."""
    prompt_text = transcript(prompt)
    if completion and completion[0]["role"] == "assistant":
        prompt_text += "\nAssistant:"
    full = transcript([*prompt, *completion])
    return prompt_text, full[len(prompt_text) :]


def text_steps(messages: Sequence[Message]) -> tuple[str, list[str]]:
    """The text prompt (the messages before the first assistant turn) and one piece per assistant turn of a
    trajectory conversation: piece ``i`` runs from the end of turn ``i - 1`` to the end of turn ``i``, so it holds
    what came back after turn ``i - 1`` (the observation, the tool results) and turn ``i``; the prompt followed by
    every piece is the transcript up to the last assistant turn (what came back after it is not a step's)."""
    starts = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
    if not starts:
        return transcript(messages), []
    prompt_text, rest = text_pair(messages[: starts[0]], messages[starts[0] : starts[-1] + 1])
    # Line m of the transcript ends at offset ends[m] (lines are joined by one newline).
    ends, offset = [], -1
    for message in messages:
        offset += len(message["role"]) + 2 + len(_message_text(message)) + 1
        ends.append(offset)
    cuts = [ends[start] - len(prompt_text) for start in starts]
    return prompt_text, [rest[begin:end] for begin, end in zip([0, *cuts], cuts, strict=False)]


def message_steps(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """The conversational form of `text_steps`, the `stepwise` export's layout: the messages before the first
    assistant turn, and one piece per assistant turn, piece ``i`` running from just after turn ``i - 1`` through turn
    ``i`` (what came back after turn ``i - 1``, then turn ``i``). The prompt followed by every piece is the
    conversation up to the last assistant turn."""
    starts = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
    if not starts:
        return list(messages), []
    ends = [start + 1 for start in starts]
    begins = [starts[0], *ends[:-1]]
    return list(messages[: starts[0]]), [list(messages[begin:end]) for begin, end in zip(begins, ends, strict=True)]


# What a judge model reads of a trajectory conversation (`judge_view`):
# - full: everything;
# - decisions: everything before the first decision (the task, the first observation), every decision (reasoning
#   and action) and the last observation; the observations and tool results between are emptied: ~4x shorter on the
#   gridworld, for environments whose reasoning restates what matters;
# - actions: every observation and every decision's action, the reasoning dropped. A judge that reads the policy's
#   reasoning can be gamed by it: PPO found a policy that writes "goal is down 0" on every turn, moves nowhere and
#   scores above the base policy's successes (the loop bench, seed 1). In this layout only what the environment saw
#   and did counts: a turn's tool calls (its ``tool_calls``, or the ``<tool_call>`` blocks of its text), or else its
#   move as `parse_decision` reads it (Tandem's gridworld turns are ``reasoning ; action X``).
# - moves: the decisions layout's observations and every action; the shortest, and the least to go on.
JUDGE_LAYOUTS = ("full", "decisions", "actions", "moves")

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S)


def judge_view(messages: Sequence[Message], layout: str) -> list[Message]:
    """A trajectory conversation as a judge of `layout` (one of ``JUDGE_LAYOUTS``) reads it; every message is kept
    (emptied, not dropped), so turns stay where they were. A judge trained on rows in one layout must read them in
    it."""
    if layout not in JUDGE_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(JUDGE_LAYOUTS)}, got {layout!r}")
    viewed = elide_observations(messages) if layout in ("decisions", "moves") else [dict(m) for m in messages]
    if layout in ("actions", "moves"):
        viewed = [action_only(message) if message["role"] == "assistant" else message for message in viewed]
    return viewed


def action_only(message: Message) -> Message:
    """An assistant turn without its reasoning: its tool calls alone, or else ``action <move>``."""
    if message.get("tool_calls"):
        return {**message, "content": ""}
    content = message.get("content") or ""
    blocks = _TOOL_CALL_BLOCK.findall(content)
    if blocks:
        return {**message, "content": "\n".join(blocks)}
    return {**message, "content": format_decision("", parse_decision(content)[1])}


def judge_pair(
    prompt: str | Sequence[Message], completion: str | Sequence[Message], layout: str
) -> tuple[str | Sequence[Message], str | Sequence[Message]]:
    """(prompt, completion) of an export row as a judge of `layout` reads them; text rows are read whole."""
    if layout == "full" or isinstance(prompt, str) or isinstance(completion, str):
        return prompt, completion
    messages = judge_view([*prompt, *completion], layout)
    return messages[: len(prompt)], messages[len(prompt) :]


def elide_observations(messages: Sequence[Message]) -> list[Message]:
    """The ``decisions`` layout of a trajectory conversation: the observations (user and tool messages) after the
    first decision emptied, but the last; everything before the first decision (the task and what the agent saw
    first) and every decision kept. A judge trained on rows in this layout must read them in it."""
    first = next((index for index, message in enumerate(messages) if message["role"] == "assistant"), len(messages))
    observations = [index for index, message in enumerate(messages) if message["role"] in ("user", "tool")]
    kept = set(range(first)) | ({observations[-1]} if observations else set())
    return [
        {**message, "content": ""} if message["role"] in ("user", "tool") and index not in kept else dict(message)
        for index, message in enumerate(messages)
    ]
