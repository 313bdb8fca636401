"""How a trajectory becomes model input, one turn at a time. Every policy, rollout and trainer goes through here.

A trajectory is a conversation: the system message is the task instruction, each user message an observation, each
assistant message the policy's decision for that observation, written as a short reasoning and then the action::

    goal is down 2 right 3 ; action right

``turn_messages`` builds the conversation the policy sees before one turn; ``encode_turn`` turns it into prompt token
ids and completion token ids, separately, which is what PPO (per-turn logprobs and values) and step-level DPO (loss on
the completion only, observations masked) need. Keeping both in this one module is what guarantees that trainers
score exactly the tokens the rollout generated.

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

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, str]

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


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> str:
    """The prompt text ending where the assistant's answer starts.

    Uses the tokenizer's chat template; a base model without one gets a plain ``Role: content`` transcript.
    """
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    lines = [f"{message['role'].capitalize()}: {message['content']}" for message in messages]
    return "\n".join(lines) + "\nAssistant:"


def encode_turn(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], completion: str) -> TurnEncoding:
    """Prompt and completion token ids for one turn, exactly as the policy generates them.

    The completion is tokenized on its own and closed with the end-of-sequence token, the way ``generate`` produced
    it after the prompt, rather than cut out of a tokenized full conversation (for BPE tokenizers the two differ at
    the seam).
    """
    return encode_turns(tokenizer, [messages], [completion])[0]


def encode_turns(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[Message]], completions: Sequence[str]
) -> list[TurnEncoding]:
    """``encode_turn`` for many turns at once (one batched tokenizer call each for prompts and completions)."""
    if len(conversations) != len(completions):
        raise ValueError(f"got {len(conversations)} conversations but {len(completions)} completions")
    prompts = [render_prompt(tokenizer, messages) for messages in conversations]
    # Plain-transcript prompts end in "Assistant:" and the answer follows after a space.
    texts = list(completions) if tokenizer.chat_template else [f" {completion}" for completion in completions]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [
        TurnEncoding(prompt_ids=prompt, completion_ids=completion + [tokenizer.eos_token_id])
        for prompt, completion in zip(prompt_ids, completion_ids, strict=True)
    ]


# --- plain-text transcripts (the `text` style of Tandem's exports) ----------------------------------------------


def transcript(messages: Sequence[Message]) -> str:
    """The plain-text transcript of `messages`, one ``Role: content`` line each (``render_prompt``'s form)."""
    return "\n".join(f"{message['role'].capitalize()}: {message['content']}" for message in messages)


def text_pair(prompt: Sequence[Message], completion: Sequence[Message]) -> tuple[str, str]:
    """The text prompt (ending where the assistant's answer starts, as ``render_prompt`` ends it) and the text
    completion; their concatenation is the transcript of the whole conversation."""
    prompt_text = transcript(prompt)
    if completion and completion[0]["role"] == "assistant":
        prompt_text += "\nAssistant:"
    full = transcript([*prompt, *completion])
    return prompt_text, full[len(prompt_text) :]


def text_steps(messages: Sequence[Message]) -> tuple[str, list[str]]:
    """The text prompt (instruction and first observation) and one piece per step of a trajectory conversation:
    piece ``i`` runs from the end of decision ``i - 1`` to the end of decision ``i``, so it holds observation ``i``
    and decision ``i``, and the prompt followed by every piece is the transcript."""
    prompt_text, rest = text_pair(messages[:2], messages[2:])
    # Line m of the transcript ends at offset ends[m] (lines are joined by one newline).
    ends, offset = [], -1
    for message in messages:
        offset += len(message["role"]) + 2 + len(message["content"]) + 1
        ends.append(offset)
    cuts = [ends[2 + 2 * step] - len(prompt_text) for step in range((len(messages) - 1) // 2)]
    return prompt_text, [rest[start:end] for start, end in zip([0, *cuts], cuts, strict=False)]


# What a judge model reads of a trajectory conversation (`judge_view`):
# - full: everything;
# - decisions: the first and the last observation and every decision (reasoning and action), the observations
#   between emptied: ~4x shorter on the gridworld, for environments whose reasoning restates what matters;
# - actions: every observation and every decision's action (`parse_decision`), the reasoning dropped. A judge that
#   reads the policy's reasoning can be gamed by it: PPO found a policy that writes "goal is down 0" on every turn,
#   moves nowhere and scores above the base policy's successes (the loop bench, seed 1). In this layout only what the
#   environment saw and did counts. It suits decisions written ``reasoning ; action X``, as Tandem's policies write
#   them; free-form chat turns with no ``action`` marker are kept whole.
# - moves: the first and the last observation and every action; the shortest, and the least to go on.
JUDGE_LAYOUTS = ("full", "decisions", "actions", "moves")


def judge_view(messages: Sequence[Message], layout: str) -> list[Message]:
    """A trajectory conversation as a judge of `layout` (one of ``JUDGE_LAYOUTS``) reads it; turns are kept, so the
    transcript still alternates. A judge trained on rows in one layout must read them in it."""
    if layout not in JUDGE_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(JUDGE_LAYOUTS)}, got {layout!r}")
    viewed = elide_observations(messages) if layout in ("decisions", "moves") else [dict(m) for m in messages]
    if layout in ("actions", "moves"):
        for message in viewed:
            if message["role"] == "assistant":
                message["content"] = format_decision("", parse_decision(message["content"])[1])
    return viewed


def judge_pair(
    prompt: str | Sequence[Message], completion: str | Sequence[Message], layout: str
) -> tuple[str | Sequence[Message], str | Sequence[Message]]:
    """(prompt, completion) of an export row as a judge of `layout` reads them; text rows are read whole."""
    if layout == "full" or isinstance(prompt, str) or isinstance(completion, str):
        return prompt, completion
    messages = judge_view([*prompt, *completion], layout)
    return messages[: len(prompt)], messages[len(prompt) :]


def elide_observations(messages: Sequence[Message]) -> list[Message]:
    """The ``decisions`` layout of a trajectory conversation: every observation but the first and the last emptied,
    turns kept (so the transcript still alternates). A judge trained on rows in this layout must read them in it."""
    users = [index for index, message in enumerate(messages) if message["role"] == "user"]
    kept = {users[0], users[-1]} if users else set()
    return [
        {**message, "content": ""} if message["role"] == "user" and index not in kept else dict(message)
        for index, message in enumerate(messages)
    ]
