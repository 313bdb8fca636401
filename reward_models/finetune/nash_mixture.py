"""Nash-MD's opponent: the geometric mixture of the policy and the reference, pi^(1-alpha) * pi_ref^alpha / Z, and
a `Policy` that writes every token from it, decoding both models step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from reward_models.policy.base import BatchedPolicy, Decision, text_decision

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def mixture_logprobs(policy_logits: torch.Tensor, reference_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """Log-probabilities of the normalised geometric mixture pi^(1-alpha) * pi_ref^alpha / Z over the last axis."""
    mixed = (1.0 - alpha) * policy_logits.float().log_softmax(-1) + alpha * reference_logits.float().log_softmax(-1)
    return mixed.log_softmax(-1)


class MixturePolicy(BatchedPolicy):
    """A `Policy` that writes each token from the geometric mixture of `model` and `reference`
    (`mixture_logprobs`), decoding both models step by step with their KV caches. Greedy takes the mixture's
    argmax; sampling draws from it at `temperature`. ``Decision.logprob`` is under the mixture."""

    def __init__(
        self,
        model: PreTrainedModel,
        reference: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        alpha: float,
        *,
        history_window: int | None,
        max_new_tokens: int,
        batch_size: int = 256,
    ) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
        self.model, self.reference, self.tokenizer, self.alpha = model, reference, tokenizer, alpha
        self.history_window = history_window
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def prompt_batch(self, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """The prompts' token ids padded on the left, on the policy's device."""
        return self.left_padded(prompts, self.model.device)

    def _generate(self, prompts: list[list[int]], greedy: bool, temperature: float, seed: int) -> list[Decision]:
        import torch

        batch = self.prompt_batch(prompts)
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        device = input_ids.device
        generator = torch.Generator(device=device).manual_seed(seed % 2**63)
        eos = self.tokenizer.eos_token_id
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        states = {id(self.model): self.model.training, id(self.reference): self.reference.training}
        self.model.eval()
        self.reference.eval()
        tokens, logprobs = [], []
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)
        try:
            with torch.inference_mode():
                step_ids, caches = input_ids, (None, None)
                for _ in range(self.max_new_tokens):
                    outputs = [
                        model(
                            input_ids=step_ids,
                            attention_mask=attention_mask,
                            position_ids=positions,
                            past_key_values=cache,
                            use_cache=True,
                        )
                        for model, cache in zip((self.model, self.reference), caches, strict=True)
                    ]
                    caches = tuple(output.past_key_values for output in outputs)
                    mixed = mixture_logprobs(outputs[0].logits[:, -1], outputs[1].logits[:, -1], self.alpha)
                    if greedy:
                        chosen = mixed.argmax(-1)
                    else:
                        chosen = torch.multinomial((mixed / temperature).softmax(-1), 1, generator=generator)[:, 0]
                    chosen = torch.where(finished, torch.full_like(chosen, self.pad_token_id), chosen)
                    tokens.append(chosen)
                    logprobs.append(torch.where(finished, 0.0, mixed.gather(-1, chosen[:, None])[:, 0]))
                    finished = finished | (chosen == eos)
                    if bool(finished.all()):
                        break
                    step_ids = chosen[:, None]
                    attention_mask = torch.cat([attention_mask, torch.ones_like(step_ids)], dim=1)
                    positions = positions[:, -1:] + 1
        finally:
            self.model.train(states[id(self.model)])
            self.reference.train(states[id(self.reference)])

        generated = torch.stack(tokens, dim=1)
        summed = torch.stack(logprobs, dim=1).sum(-1)
        decisions = []
        for row in range(generated.shape[0]):
            ids = generated[row].tolist()
            if eos in ids:
                ids = ids[: ids.index(eos) + 1]
            # The generated text exactly, as `LocalCausalLMPolicy` keeps it: special tokens dropped, nothing stripped.
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            decisions.append(text_decision(text, logprob=float(summed[row]), token_ids=ids))
        return decisions
