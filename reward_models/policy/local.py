"""A policy backed by any Hugging Face causal-LM directory on local disk (the tiny built-in policy included)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reward_models.policy.base import BatchedPolicy, Decision, text_decision
from reward_models.policy.model import read_policy_settings

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class LocalCausalLMPolicy(BatchedPolicy):
    """Batched generation from a local causal LM, loaded offline.

    Prompts are rendered with the tokenizer's chat template (``turns.render_prompt``), left-padded, and decoded
    with ``model.generate`` (KV cache), greedily or by plain temperature sampling (no top-k/top-p, so the sampled
    distribution is the model's own). Sampling is reproducible: each batch runs under ``torch.manual_seed`` in a
    forked RNG, so the caller's random state is untouched.

    >>> policy = LocalCausalLMPolicy("var/policies/bootstrap")  # doctest: +SKIP
    >>> policy.act([turn_messages(task["instruction"], [], observation, policy.history_window)])  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        *,
        max_new_tokens: int | None = None,
        batch_size: int = 256,
    ) -> None:
        """The history window and token budget come from the directory's ``tandem_policy.json`` (see
        ``reward_models.policy.model``); ``max_new_tokens`` overrides the latter."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        settings = read_policy_settings(path)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
        self._setup(
            model.to(device),
            tokenizer,
            history_window=settings["history_window"],
            max_new_tokens=max_new_tokens or settings["max_new_tokens"],
            batch_size=batch_size,
        )

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        history_window: int | None,
        max_new_tokens: int,
        batch_size: int = 256,
    ) -> LocalCausalLMPolicy:
        """Wrap a model already in memory (a trainer evaluating its own policy) without a save and reload."""
        policy = cls.__new__(cls)
        policy._setup(
            model, tokenizer, history_window=history_window, max_new_tokens=max_new_tokens, batch_size=batch_size
        )
        return policy

    def _setup(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        history_window: int | None,
        max_new_tokens: int,
        batch_size: int,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        # Many base models ship without a pad token (Llama 3, Mistral); padding positions are masked, so the
        # end-of-sequence token serves, for the tokenizer's own padding as for generate's.
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_token_id = tokenizer.pad_token_id
        self.history_window = history_window
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    def _generate(self, prompts: list[str], greedy: bool, temperature: float, seed: int) -> list[Decision]:
        import torch
        from transformers import GenerationConfig

        was_training = self.model.training
        self.model.eval()
        device = self.model.device
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        generation_config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            # 0 and 1.0 switch off the top-k/top-p filters that a model's generation_config or transformers'
            # defaults (top_k=50) would otherwise apply; None would let those through.
            top_k=None if greedy else 0,
            top_p=None if greedy else 1.0,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            torch.manual_seed(seed)
            output = self.model.generate(**batch, generation_config=generation_config)
        self.model.train(was_training)

        generated = output.sequences[:, batch["input_ids"].shape[1] :]
        # Raw logits, not the warped scores: the logprob is under the model itself, whatever the temperature.
        logprobs = torch.stack(output.logits, dim=1).float().log_softmax(dim=-1)
        token_logprobs = logprobs.gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        # Tokens up to and including the first end-of-sequence; after it generate() only pads.
        is_eos = generated == self.tokenizer.eos_token_id
        finished_before = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
        keep = ~finished_before

        decisions = []
        for row in range(generated.shape[0]):
            ids = generated[row][keep[row]]
            # The generated text exactly: special tokens (the end of turn) dropped, nothing stripped, so a chat
            # template renders the turn back to these tokens.
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            logprob = float(token_logprobs[row][keep[row]].sum())
            decisions.append(text_decision(text, logprob=logprob, token_ids=ids.tolist()))
        return decisions


def generated_logprob(model: PreTrainedModel, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """The summed log-probability of ``completion_ids`` after ``prompt_ids`` (a scalar tensor, with grad)."""
    import torch

    input_ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    logits = model(input_ids=input_ids).logits[0, len(prompt_ids) - 1 : -1].float()
    targets = input_ids[0, len(prompt_ids) :]
    return logits.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).sum()
