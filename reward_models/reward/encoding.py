"""What the reward model reads: a preference row in a layout, and prompt + completion as token ids (chat template
or transcript, cut in the middle to fit), the same way in training and in scoring."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.data import message_text
from reward_models.policy.turns import judge_pair, text_pair

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Conversation = str | Sequence[Mapping[str, Any]]
Tools = Sequence[dict[str, Any]] | None
# What a model was trained on, and so reads: message lists through the chat template, or text.
STYLES = ("conversational", "text")


def row_in_layout(row: dict[str, Any], layout: str) -> dict[str, Any]:
    """A conversational preference row with its prompt, chosen and rejected cut to what `layout` keeps."""
    if layout == "full" or isinstance(row["prompt"], str):
        return row
    prompt = row["prompt"]
    return {
        **row,
        "prompt": judge_pair(prompt, [], layout)[0],
        "chosen": judge_pair(prompt, row["chosen"], layout)[1],
        "rejected": judge_pair(prompt, row["rejected"], layout)[1],
    }


def encode(
    tokenizer: PreTrainedTokenizerBase, prompt: Conversation, completion: Conversation, tools: Tools = None
) -> list[int]:
    """Token ids of prompt + completion as the reward model reads them, the way TRL's `RewardTrainer` tokenises a
    preference row: conversations through the chat template with the row's `tools` (as one ``Role: content``
    transcript when the tokenizer has none), text as the concatenated string, ending in EOS when the tokenizer has
    one."""
    if isinstance(prompt, str) != isinstance(completion, str):
        raise ValueError("prompt and completion must both be text or both be message lists")
    if not isinstance(prompt, str) and tokenizer.chat_template:
        encoded = tokenizer.apply_chat_template(
            [*prompt, *completion], tools=list(tools) if tools else None, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    text = prompt + completion if isinstance(prompt, str) else message_text([*prompt, *completion])
    ids = list(tokenizer(text)["input_ids"])
    # The EOS id, not its string: a word-level tokenizer would read "...left<eos>" as one unknown word.
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_as_trained(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Conversation,
    completion: Conversation,
    tools: Tools,
    *,
    style: str,
    layout: str,
    max_length: int,
) -> list[int]:
    """Token ids of one example as a judge trained on rows of `style` in `layout` reads it: a conversation given
    to a judge trained on text rows is read as its transcript (`turns.text_pair`, the text export's form); text
    given to a judge trained on conversations is an error, since nothing can render it as the chat template did."""
    if style == "text" and not isinstance(prompt, str):
        prompt, completion = text_pair(prompt, completion)
    if style == "conversational" and isinstance(prompt, str):
        raise ValueError("this judge was trained on conversations (message lists) and cannot read text")
    prompt, completion = judge_pair(prompt, completion, layout)
    return fit_length(encode(tokenizer, prompt, completion, tools), max_length)


class TrainedEncoding:
    """What a judge loaded for scoring shares: it reads examples as its training rows were read
    (`encode_as_trained`, with the judge's tokenizer, style, layout and length)."""

    tokenizer: PreTrainedTokenizerBase
    style: str
    layout: str
    max_length: int

    def encode(self, prompt: Conversation, completion: Conversation, tools: Tools = None) -> list[int]:
        return encode_as_trained(
            self.tokenizer, prompt, completion, tools, style=self.style, layout=self.layout, max_length=self.max_length
        )

    def encode_all(
        self, prompts: Sequence[Conversation], completions: Sequence[Conversation], tools: Sequence[Tools] = ()
    ) -> list[list[int]]:
        """`encode` of each example; `tools` holds one list of tool schemas (or None) per example, or is empty when
        no example offers tools."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        offered = list(tools) or [None] * len(prompts)
        return [self.encode(p, c, t) for p, c, t in zip(prompts, completions, offered, strict=True)]


def fit_length(ids: list[int], max_length: int) -> list[int]:
    """Cut an over-long sequence in the middle: a trajectory's start (task, first observation) and its end (the
    outcome) say the most about it. TRL would drop the whole pair instead."""
    if len(ids) <= max_length:
        return ids
    head = max_length // 2
    return ids[:head] + ids[len(ids) - (max_length - head) :]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with EOS as the pad token when it has none (TRL's choice)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
