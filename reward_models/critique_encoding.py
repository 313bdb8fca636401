"""How the generative critic reads its examples: a critique prompt as tokens (chat template with the generation
prompt, or the ``Role: content`` transcript), a training row as (prompt tokens, critique tokens) the way TRL's
prompt-completion preparation tokenises it, and cutting both to fit. Training (`reward_models.critic_lm`) and
generation (`GenerativeCritic.critiques`) use the same functions, so both see the same text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reward_models.policy.turns import render_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Prompt = str | Sequence[Mapping[str, Any]]
Tools = Sequence[dict[str, Any]] | None


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The critique itself: a text completion as it is, a message list as its messages' contents."""
    if isinstance(completion, str):
        return completion
    return "\n".join(message["content"] for message in completion)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, tools: Tools = None) -> list[int]:
    """The prompt's tokens, ending where the critique starts: a message list through the chat template with the
    generation prompt and `tools` (or, without a template, the ``Role: content`` transcript ending in
    ``Assistant:``), text as the tokenizer reads it."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if tokenizer.chat_template:
        encoded = tokenizer.apply_chat_template(
            list(prompt),
            tools=list(tools) if tools else None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        return list(encoded["input_ids"])
    return list(tokenizer(render_prompt(tokenizer, prompt))["input_ids"])


def encode_example(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    completion: str | Sequence[Mapping[str, Any]],
    tools: Tools = None,
) -> tuple[list[int], list[int]]:
    """(prompt tokens, critique tokens) of one training row, as TRL's prompt-completion preparation tokenises it:
    the critique is what prompt + completion adds to the prompt (their common prefix is the prompt), and ends in EOS
    (the chat template's end of turn, or the EOS id after text)."""
    if isinstance(prompt, str) or not tokenizer.chat_template:
        if isinstance(prompt, str):
            prompt_text = prompt
            critique = completion if isinstance(completion, str) else " " + completion_text(completion)
        else:
            prompt_text = render_prompt(tokenizer, prompt)
            critique = " " + completion_text(completion)
        full = list(tokenizer(prompt_text + critique)["input_ids"])
        # The EOS id, not its string: a word-level tokenizer would read "...better<eos>" as one unknown word.
        if tokenizer.eos_token_id is not None and (not full or full[-1] != tokenizer.eos_token_id):
            full.append(tokenizer.eos_token_id)
        head = list(tokenizer(prompt_text)["input_ids"])
    else:
        messages = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion)
        head = prompt_ids(tokenizer, prompt, tools)
        encoded = tokenizer.apply_chat_template(
            [*prompt, *messages], tools=list(tools) if tools else None, tokenize=True, return_dict=True
        )
        full = list(encoded["input_ids"])
    shared = 0
    for a, b in zip(head, full, strict=False):
        if a != b:
            break
        shared += 1
    return full[:shared], full[shared:]


def fit_prompt(ids: list[int], budget: int) -> list[int]:
    """Cut an over-long prompt in the middle: its start (the task and first observation) and its end (the steps
    nearest the request, and the request) say the most."""
    if len(ids) <= budget:
        return ids
    head = budget // 2
    return ids[:head] + ids[len(ids) - (budget - head) :]


def fit_example(prompt: list[int], critique: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Fit prompt + critique into `max_length` tokens: the critique keeps up to half of them (its start, if it is
    longer still), the prompt the rest, cut in the middle."""
    if len(prompt) + len(critique) <= max_length:
        return prompt, critique
    critique = critique[: max(max_length // 2, max_length - len(prompt))]
    return fit_prompt(prompt, max_length - len(critique)), critique
