"""The tiny causal-LM policy: a small Llama built from a config, and how a policy directory is saved.

A policy directory is an ordinary Hugging Face one (``AutoModelForCausalLM.from_pretrained(path)`` and
``AutoTokenizer.from_pretrained(path)`` load it offline) plus ``tandem_policy.json``, which records how Tandem drives
it: the history window and the most tokens a turn may generate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

POLICY_SETTINGS_FILE = "tandem_policy.json"
DEFAULT_SETTINGS: dict[str, Any] = {"history_window": None, "max_new_tokens": 64}


def build_tiny_llama(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 3,
    num_heads: int = 4,
    intermediate_size: int = 256,
    max_positions: int = 512,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A freshly initialised Llama sized for ``tokenizer`` (defaults: ~0.5M parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = _sized_config(
        LlamaConfig,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    return _initialised(LlamaForCausalLM, config, seed)


def build_tiny_qwen2(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    seed: int = 0,
) -> Any:
    """A freshly initialised Qwen2 with tied embeddings (copying a token from the context onto the output is then the
    identity), sized for ``tokenizer``, for chat models with a Qwen2.5 template."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = _sized_config(
        Qwen2Config,
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
    )
    return _initialised(Qwen2ForCausalLM, config, seed)


def _sized_config(
    config_class: type,
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    **settings: Any,
) -> Any:
    """A `config_class` model config sized for `tokenizer` (its vocabulary, and its padding and end-of-sequence
    tokens), with as many key-value heads as attention heads, and the model's own `settings`."""
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **settings,
    )


def _initialised(model_class: type, config: Any, seed: int) -> Any:
    """A model of `model_class` initialised under its own seed, without disturbing the caller's global RNG stream."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(config)


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    *,
    history_window: int | None,
    max_new_tokens: int,
) -> Path:
    """Write weights (safetensors), tokenizer and ``tandem_policy.json`` into one directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    settings = {"history_window": history_window, "max_new_tokens": max_new_tokens}
    (path / POLICY_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    return path


def read_policy_settings(path: str | Path) -> dict[str, Any]:
    """The directory's ``tandem_policy.json`` over the defaults for any causal LM (full history, 64 new tokens)."""
    settings_file = Path(path) / POLICY_SETTINGS_FILE
    if not settings_file.exists():
        return dict(DEFAULT_SETTINGS)
    return {**DEFAULT_SETTINGS, **json.loads(settings_file.read_text())}
