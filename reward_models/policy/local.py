"""A policy backed by any Hugging Face causal-LM directory on local disk (the tiny built-in policy included)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        max_prompt_tokens: int = 0,
        prefill_tokens: int = 4096,
    ) -> None:
        """The history window and token budget come from the directory's ``tandem_policy.json`` (see
        ``reward_models.policy.model``); ``max_new_tokens`` overrides the latter. ``batch_size`` conversations are
        generated at once; ``max_prompt_tokens`` cuts longer prompts (`turns.cut_prompt`; 0: never); the prompts are
        read in chunks of about ``prefill_tokens`` tokens over the batch, so that reading them never holds more
        activations than that (the KV cache, which generation needs anyway, is the rest)."""
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
            max_prompt_tokens=max_prompt_tokens,
            prefill_tokens=prefill_tokens,
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
        max_prompt_tokens: int = 0,
        prefill_tokens: int = 4096,
    ) -> LocalCausalLMPolicy:
        """Wrap a model already in memory (a trainer evaluating its own policy) without a save and reload."""
        policy = cls.__new__(cls)
        policy._setup(
            model,
            tokenizer,
            history_window=history_window,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            max_prompt_tokens=max_prompt_tokens,
            prefill_tokens=prefill_tokens,
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
        max_prompt_tokens: int = 0,
        prefill_tokens: int = 4096,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if max_prompt_tokens < 0:
            raise ValueError(f"max_prompt_tokens must be 0 (no cut) or positive, got {max_prompt_tokens}")
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be at least 1, got {prefill_tokens}")
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
        self.max_prompt_tokens = max_prompt_tokens
        self.prefill_tokens = prefill_tokens

    def _generate(self, prompts: list[list[int]], greedy: bool, temperature: float, seed: int) -> list[Decision]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        was_training = self.model.training
        self.model.eval()
        device = self.model.device
        batch = self.left_padded(prompts, device)
        recorder = ChosenTokenLogprobs()
        generation_config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            # 0 and 1.0 switch off the top-k/top-p filters that a model's generation_config or transformers'
            # defaults (top_k=50) would otherwise apply; None would let those through. A checkpoint's repetition
            # penalty (Qwen ships 1.05) is switched off too: the policy samples from its own distribution, the one
            # whose log-probabilities trainers compute.
            top_k=None if greedy else 0,
            top_p=None if greedy else 1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            # Prompts read a chunk of positions at a time (the same result: each chunk attends to the cache).
            prefill_chunk_size=max(8, self.prefill_tokens // len(prompts)),
            pad_token_id=self.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            torch.manual_seed(seed)
            sequences = self.model.generate(
                **batch,
                generation_config=generation_config,
                logits_processor=LogitsProcessorList([recorder]),
                **self._cpu_cache(batch["input_ids"].shape[1]),
            )
            generated = sequences[:, batch["input_ids"].shape[1] :]
            token_logprobs = recorder.finish(generated)
        self.model.train(was_training)

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

    def _cpu_cache(self, prompt_width: int) -> dict[str, Any]:
        """On the CPU, a cache laid out once for the call, as long as its prompts and new tokens: the default cache
        grows by concatenation, copying every key and value at every token, which took 40 % of a small policy's
        generation there (the same tokens come in two thirds of the time). transformers' own static cache would be as
        long as the longest call on the model so far, so every short call after a long one would attend over the
        longer cache, in more time and with sums of another length: what a call generates would depend on the calls
        before it. On a GPU, a static cache makes generate() compile the model (transformers' auto-compile), so the
        default stays; so it does for a model that takes no cache object (a state-space model) or another kind (an
        encoder-decoder), and for a checkpoint whose generation config names its own cache."""
        takes_cache = getattr(self.model, "_supports_default_dynamic_cache", lambda: True)()
        own = getattr(getattr(self.model, "generation_config", None), "cache_implementation", None)
        if self.model.device.type != "cpu" or self.model.config.is_encoder_decoder or not takes_cache or own:
            return {}
        from transformers import StaticCache

        config = self.model.config.get_text_config(decoder=True)
        return {"cache": StaticCache(config=config, max_cache_len=prompt_width + self.max_new_tokens)}


def generated_logprob(model: PreTrainedModel, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """The summed log-probability of ``completion_ids`` after ``prompt_ids`` (a scalar tensor, with grad)."""
    import torch

    input_ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    logits = model(input_ids=input_ids).logits[0, len(prompt_ids) - 1 : -1].float()
    targets = input_ids[0, len(prompt_ids) :]
    return logits.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).sum()


class ChosenTokenLogprobs:
    """A logits processor that records the log-probability of each token `generate` chooses, under the model's own
    logits (before temperature or any filter), and keeps nothing else.

    Asking `generate` for its logits instead keeps a float for every vocabulary entry at every step of every row: at
    a 152k vocabulary, 32 rows and 256 new tokens that is 5 GB, more than a 0.5B model's weights. This holds one
    step's log-probabilities at a time. It must see the raw logits, so it runs where transformers puts custom
    processors: after the logits-changing processors (none of which `LocalCausalLMPolicy` enables) and before the
    temperature and the sampling filters.
    """

    def __init__(self) -> None:
        self._previous: torch.Tensor | None = None
        self._chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._previous is not None:
            self._chosen.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._previous = scores.float().log_softmax(dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """The log-probability of every generated token (rows x new tokens), the last one included."""
        import torch

        if self._previous is not None:
            self._chosen.append(self._previous.gather(-1, generated[:, -1:]).squeeze(-1))
            self._previous = None
        if not self._chosen:
            return generated.new_zeros(generated.shape, dtype=torch.float32)
        return torch.stack(self._chosen, dim=1)
