"""Turns, padding and log-probabilities: the observation mask every policy trainer relies on.

A trajectory is a conversation (`reward_models.conversation`), and the policy only ever writes the assistant turns.
Every trainer scores a trajectory turn by turn: turn ``i`` is encoded as the prompt the policy saw before it (the
conversation so far through its history window, rendered by its chat template with the task's tools:
`turns.encode_conversation`) and the assistant message it wrote, exactly as ``LocalCausalLMPolicy`` generated it (its
token ids, where a rollout kept them). ``pad_turns`` marks the completion tokens, and ``token_logprobs`` keeps the
log-probabilities of those tokens only, so instruction, observation, tool-result and padding tokens are context,
never targets: no loss is taken on them and no gradient reaches their logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from reward_models.common.batching import length_groups
from reward_models.conversation import Conversation, Message, build_conversation, split_conversation
from reward_models.policy.turns import TurnEncoding, encode_conversation

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.rollout import Episode


def row_conversation(messages: Sequence[Message]) -> Conversation:
    """An exported message list as a trajectory conversation: the messages before the first assistant message are
    its prompt, and each assistant message starts a step (`conversation.split_conversation`)."""
    return build_conversation(*split_conversation(messages))


def is_messages(value: Any) -> bool:
    """Whether `value` is a list of chat messages (dicts with a role), as a conversational export writes them."""
    return isinstance(value, list) and all(isinstance(message, dict) and "role" in message for message in value)


def prompt_steps(prompt: Sequence[Message]) -> int:
    """How many of a conversation's steps a row's prompt already holds (its assistant messages)."""
    return sum(message.get("role") == "assistant" for message in prompt)


def episode_encodings(
    tokenizer: PreTrainedTokenizerBase, episode: Episode, history_window: int | None, *, max_prompt_tokens: int = 0
) -> list[TurnEncoding]:
    """Every turn of a rollout's episode as the policy saw it (`turns.encode_conversation`, with the episode's
    tools) and wrote it: each completion is the token ids generation produced where the step kept them (decoding
    and re-encoding a sampled completion need not give the same tokens back: a special token the text drops, for
    one). `max_prompt_tokens` cuts the prompts as the policy's generation cut them (`turns.cut_prompt`)."""
    encodings = encode_conversation(
        tokenizer,
        episode.conversation(),
        episode.tools or None,
        history_window,
        max_prompt_tokens=max_prompt_tokens,
    )
    return [
        TurnEncoding(encoding.prompt_ids, list(step.token_ids)) if step.token_ids else encoding
        for encoding, step in zip(encodings, episode.steps, strict=True)
    ]


@dataclass
class TurnBatch:
    input_ids: torch.Tensor  # (B, T): prompts padded on the left, completions on the right (`pad_turns`)
    attention_mask: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T): 1 on the policy's own tokens, 0 on prompt and padding
    position_ids: torch.Tensor  # (B, T): each token's position in its own row (padding before it does not count)

    def to(self, device: Any) -> TurnBatch:
        return TurnBatch(*(getattr(self, column.name).to(device) for column in fields(self)))

    def columns(self, first: int) -> TurnBatch:
        """The batch from column `first` on."""
        return TurnBatch(*(getattr(self, column.name)[:, first:] for column in fields(self)))


def pad_turns(encodings: Sequence[TurnEncoding], pad_token_id: int, max_length: int | None = None) -> TurnBatch:
    """One batch of turns in which every completion starts at the same column: prompts padded on the left,
    completions on the right, and position ids that count each row's own tokens (so a row computes as it would
    alone). The logits that score the completions are then the same last columns of every row (`completion_logits`).
    With `max_length`, a prompt too long is cut from the left (the oldest history goes first) and a completion longer
    than `max_length` is cut at the end, short of one prompt token: a completion's first token is predicted from the
    token before it, so in a row with no prompt it is not scored (it is masked out of `completion_mask`)."""
    import torch

    if not encodings:
        raise ValueError("pad_turns needs at least one turn")
    turns = []
    for encoding in encodings:
        prompt, completion = list(encoding.prompt_ids), list(encoding.completion_ids)
        if max_length is not None and len(prompt) + len(completion) > max_length:
            completion = completion[: max_length - 1 if prompt else max_length]
            keep = max_length - len(completion)
            prompt = prompt[len(prompt) - keep :] if keep else []
        turns.append((prompt, completion))
    prompt_width = max(len(prompt) for prompt, _ in turns)
    shape = (len(turns), prompt_width + max(len(completion) for _, completion in turns))
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    completion_mask = torch.zeros(shape, dtype=torch.long)
    for index, (prompt, completion) in enumerate(turns):
        start, end = prompt_width - len(prompt), prompt_width + len(completion)
        input_ids[index, start:end] = torch.tensor(prompt + completion, dtype=torch.long)
        attention_mask[index, start:end] = 1
        completion_mask[index, prompt_width + (0 if prompt else 1) : end] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return TurnBatch(input_ids, attention_mask, completion_mask, position_ids)


def like_lengths(
    encodings: Sequence[TurnEncoding], indices: Sequence[int], size: int | None = None
) -> list[list[int]]:
    """`indices` into `encodings` in groups of like length, at most `size` turns each (`batching.length_groups`):
    `pad_turns` pads a batch to its longest prompt and its longest completion, and each row computes as it would
    alone, so a turn's log-probabilities do not depend on the turns beside it."""
    shapes = [(len(encodings[index].prompt_ids), len(encodings[index].completion_ids)) for index in indices]
    return [[indices[position] for position in group] for group in length_groups(shapes, size)]


def completion_logits(
    model: PreTrainedModel, batch: TurnBatch, temperature: float = 1.0
) -> tuple[torch.Tensor, TurnBatch]:
    """The logits of a batch of turns (`pad_turns`) at the columns that predict its completion tokens, at
    `temperature` as sampling scaled them, and the batch cut to those columns: `token_logprobs(model, cut, logits)`
    and a mask of `cut` line up with them. The language-model head and the softmax then run on the completions
    only, not on every prompt token (with a large vocabulary the logits of whole prompts outweigh the model); the
    head is cut inside the model where its forward takes `logits_to_keep`, as transformers' causal LMs do."""
    completion_columns = batch.completion_mask.any(dim=0).nonzero()
    first = max(int(completion_columns[0]) - 1, 0) if len(completion_columns) else 0
    keep = batch.input_ids.shape[1] - first
    extra = {"logits_to_keep": keep} if _takes_logits_to_keep(model) else {}
    output = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, **extra
    )
    logits = output.logits[:, -keep:]
    return (logits / temperature if temperature != 1.0 else logits), batch.columns(first)


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether the model under any DistributedDataParallel or peft wrapper takes `logits_to_keep`."""
    import inspect

    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def token_logprobs(
    model: PreTrainedModel, batch: TurnBatch, logits: torch.Tensor | None = None, *, temperature: float = 1.0
) -> torch.Tensor:
    """(B, T): log p(token t | tokens before it) at completion tokens, 0 elsewhere (and at position 0). Pass
    `logits` (as wide as `batch`) when the caller already ran the model, e.g. to take the entropy too; without them,
    the model scores the completion columns only (`completion_logits`). With `temperature`, the model's own logits
    are divided by it first, as sampling at that temperature did: an on-policy update scores the tokens under the
    distribution that drew them."""
    import torch

    if logits is None:
        logits, cut = completion_logits(model, batch, temperature)
        scored = token_logprobs(model, cut, logits)
        return torch.nn.functional.pad(scored, (batch.input_ids.shape[1] - scored.shape[1], 0))
    if temperature != 1.0:
        raise ValueError("temperature: given logits are used as they are; scale them before passing them")
    # Only the rows that predict a completion token go through the log-softmax: a turn's prompt is most of its
    # tokens, and the normaliser over the whole vocabulary is most of this function's cost at every row it runs on.
    mask = batch.completion_mask[:, 1:].bool()
    picked = logits[:, :-1][mask].float()
    chosen = picked.gather(-1, batch.input_ids[:, 1:][mask].unsqueeze(-1)).squeeze(-1) - picked.logsumexp(dim=-1)
    # Scattered back into the batch's shape: positions off the completion are 0 and get no gradient.
    full = torch.zeros(mask.shape, dtype=chosen.dtype, device=chosen.device).masked_scatter(mask, chosen)
    return torch.nn.functional.pad(full, (1, 0))


def completion_logprobs(model: PreTrainedModel, batch: TurnBatch) -> torch.Tensor:
    """(B,): the summed log-probability of each row's completion under `model`."""
    return token_logprobs(model, batch).sum(dim=-1)
