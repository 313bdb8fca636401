"""The policy interface: given a batch of conversations (``reward_models.conversation``), decide each one's next
turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from reward_models.conversation import message_tool_calls
from reward_models.policy.turns import Message, cut_prompt, render_prompt

# A conversation's messages, and the tool schemas the chat template offers the model in it (or None).
Conversation = Sequence[Message]
Tools = Sequence[dict[str, Any]] | None


@dataclass
class Decision:
    """One generated turn, verbatim. ``message`` is the assistant message as the policy produced it: for a local
    model ``{"role": "assistant", "content": text}`` with ``text`` the decoded generated tokens (tool-call markup
    included, so a chat template renders exactly what was generated); for an endpoint, the message the server sent,
    its ``tool_calls`` field included. ``logprob`` is the summed log-probability of the generated tokens under the
    model at temperature 1 (the quantity trainers recompute), or None when the policy cannot report it."""

    text: str
    message: Message
    logprob: float | None = None
    # The generated token ids (the end-of-sequence token included when generation reached it), when the policy
    # runs locally: trainers score exactly these, since decoding and re-encoding the text need not give them back.
    token_ids: list[int] | None = None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls the turn makes: the message's ``tool_calls`` field, or else the ``<tool_call>`` blocks its
        text holds (how Qwen-style models write them)."""
        return message_tool_calls(self.message)


def text_decision(text: str, **fields: Any) -> Decision:
    """The decision of a policy that writes plain text (a local model): the text is the message's content."""
    return Decision(text=text, message={"role": "assistant", "content": text}, **fields)


@runtime_checkable
class Policy(Protocol):
    # How many previous turns the policy is shown; None shows all (see reward_models.policy.turns).
    history_window: int | None

    def act(
        self,
        conversations: Sequence[Conversation],
        *,
        tools: Sequence[Tools] | None = None,
        greedy: bool = True,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Decision]:
        """One decision per conversation, in order. ``tools`` (one list of tool schemas per conversation, or None)
        are what the chat template offers the model. The same inputs and seed give the same decisions."""
        ...


class ConversationPolicy:
    """The package's own policies' `act`: ``tools`` made one entry per conversation (None for each when it is not
    given), then `_decide` on the batch, which a subclass implements."""

    def act(
        self,
        conversations: Sequence[Conversation],
        *,
        tools: Sequence[Tools] | None = None,
        greedy: bool = True,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Decision]:
        """`Policy.act`."""
        offered = list(tools) if tools is not None else [None] * len(conversations)
        return self._decide(conversations, offered, greedy, temperature, seed)

    def _decide(
        self, conversations: Sequence[Conversation], tools: list[Tools], greedy: bool, temperature: float, seed: int
    ) -> list[Decision]:
        """One decision per conversation, with `tools` holding one entry per conversation."""
        raise NotImplementedError


class BatchedPolicy(ConversationPolicy):
    """`act` for a local model's policies: each conversation rendered with the tokenizer's chat template and
    tokenized (cut to `max_prompt_tokens` by `turns.cut_prompt` when that is set), then `_generate` on `batch_size`
    prompts at a time, seeded by the batch's offset."""

    tokenizer: Any
    batch_size: int
    max_prompt_tokens: int = 0

    def _decide(
        self, conversations: Sequence[Conversation], tools: list[Tools], greedy: bool, temperature: float, seed: int
    ) -> list[Decision]:
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be positive when sampling, got {temperature}")
        rendered = [
            render_prompt(self.tokenizer, conversation, offered)
            for conversation, offered in zip(conversations, tools, strict=True)
        ]
        prompts = self.tokenizer(rendered, add_special_tokens=False)["input_ids"] if rendered else []
        if self.max_prompt_tokens:
            prompts = [
                cut_prompt(self.tokenizer, conversation, offered, ids, self.max_prompt_tokens)
                for conversation, offered, ids in zip(conversations, tools, prompts, strict=True)
            ]
        decisions: list[Decision] = []
        for start in range(0, len(prompts), self.batch_size):
            decisions += self._generate(prompts[start : start + self.batch_size], greedy, temperature, seed + start)
        return decisions

    def _generate(self, prompts: list[list[int]], greedy: bool, temperature: float, seed: int) -> list[Decision]:
        """One decision per prompt (token ids, unpadded)."""
        raise NotImplementedError

    def left_padded(self, prompts: Sequence[Sequence[int]], device: Any) -> dict[str, Any]:
        """`input_ids` and `attention_mask` of `prompts` padded on the left, on `device`."""
        import torch

        width = max(len(ids) for ids in prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
        return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
