"""Loading a policy directory to train or to keep frozen as a reference: the model (optionally with LoRA
adapters), its tokenizer and its saved settings, the model under training as a policy that plays episodes, and
switching dropout off for online RL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.judge_config import model_directory
from reward_models.common.runtime import lora_settings
from reward_models.policy.model import read_policy_settings

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.policy.local import LocalCausalLMPolicy


@dataclass
class PolicyModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    settings: dict[str, Any]  # tandem_policy.json: history_window, max_new_tokens


def load_policy_model(
    path: str | Path,
    *,
    use_lora: bool = False,
    lora_r: int = 16,
    trainable: bool = True,
    device: str | None = None,
    field_name: str = "policy_path",
    dropout: bool = True,
    precision: str = "fp32",
) -> PolicyModel:
    """A policy directory, loaded offline, with fp32 weights (accelerate's mixed precision computes in bf16/fp16).
    A trainable one is optionally wrapped in LoRA adapters; a frozen one (`trainable=False`, a reference) is in eval
    mode, and run under the same `accelerator.autocast()` as the policy it has the policy's numerics exactly (a
    reference kept in bf16 disagreed with the unchanged policy by 0.02 nats of KL on a GPU). A directory that is not
    a model is a `ConfigError` on `field_name`. `dropout=False` switches the checkpoint's dropout off
    (`disable_dropout`), as online RL needs.

    With LoRA and a resolved `precision` of bf16 or fp16, the frozen base weights are kept in that precision (half
    the memory) and only the adapters in fp32, which is safe since the optimiser never updates the base; its
    reference, the same model with the adapters off, then computes exactly as the policy. Weights the optimiser
    updates stay fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_directory(path, field_name)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.float32
    if trainable and use_lora:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    if device is not None:
        model = model.to(device)
    if trainable and use_lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_settings(lora_r))
    if not dropout:
        disable_dropout(model)
    if not trainable:
        model.eval().requires_grad_(False)
    return PolicyModel(model, tokenizer, read_policy_settings(path))


def playing_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: dict[str, Any], config: Any, **options: Any
) -> LocalCausalLMPolicy:
    """`model` (unwrapped) as the policy that plays episodes for a training run or its evaluation: the directory's
    saved history window and turn length, `config.generation_batch_size` episodes' turns generated at a time, and
    any other `LocalCausalLMPolicy.from_model` `options`."""
    from reward_models.policy.local import LocalCausalLMPolicy

    return LocalCausalLMPolicy.from_model(
        model,
        tokenizer,
        history_window=settings["history_window"],
        max_new_tokens=settings["max_new_tokens"],
        batch_size=config.generation_batch_size,
        **options,
    )


def disable_dropout(model: torch.nn.Module) -> None:
    """Switch every dropout off for good, in training mode too: each `nn.Dropout` (GPT-2's residual, embedding and
    attention dropout, LoRA's) and each attention module's `attention_dropout` (Llama- and Qwen-style attention
    applies it itself while training). Online RL needs this: the log-probabilities of its update pass must be those of
    the function the rollouts sampled from (the importance ratio is 1 before the first step), and a critic's values
    those it will be trained towards. Training mode stays, so activation checkpointing still works."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
