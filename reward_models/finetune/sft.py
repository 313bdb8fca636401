"""Supervised fine-tuning (SFT) of a policy on what people wrote: interventions, takeovers and demonstrations.

The data is the `sft` export: ``messages`` (a trajectory conversation), ``tools`` (the tool schemas the agent was
offered), ``source`` (intervention, takeover or demonstration) and ``step_index`` (where the person took over; none for
a demonstration). Every assistant turn from ``step_index`` on is one training example, with its own prompt: the
prompt the policy sees before that turn (`turns.encode_conversation`: the conversation so far through its history
window, rendered by its chat template with the tools), and the person's assistant message as the completion, closed
by end-of-sequence. Turns before ``step_index`` are the policy's own steps that the person let stand, and are context
only. The examples reach TRL's `SFTTrainer` already tokenized with their labels, so the loss is on the assistant
tokens only: observations and tool results are prompt tokens (label -100) and get no loss.

On intervention corrections this is behaviour cloning of the corrections on the policy's own states (DAgger-style);
it is the baseline the preference methods (`dpo`, `kto`) are measured against. Measured on the bootstrapped gridworld
policy (47 % greedy, 52 % sampled success on the 200 held-out tasks) with 859 oracle corrections on its own rollouts
of training tasks: 46.5 % greedy and 62.5 % sampled with the defaults (47.5 % and 61 % at learning rate 3e-4); DPO
with an SFT term on the same corrections (`dpo`'s defaults) reaches 51 % and 67.5 %.

Defaults suit the tiny gridworld policy on 2 CPU cores. For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.sft --policy_path var/policies/qwen --data_path sft.jsonl \\
        --output_dir var/policies/sft --use_lora true --lora_r 16 --learning_rate 2e-5 --batch_size 8 \\
        --precision bf16 --gradient_checkpointing true

Example::

    from reward_models.finetune.sft import SFTConfig, main

    config = SFTConfig(policy_path="var/policies/bootstrap", data_path="sft.jsonl", output_dir="var/policies/sft")
    summary = main(config)
    summary["metrics"]["final"]["greedy_success"]
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, require
from reward_models.common.data import bad_rows, row_tools, rows_error
from reward_models.common.reporting import Reporter, without_printer
from reward_models.finetune.config import PolicyTrainConfig, gradient_checkpointing_field, turn_length_field
from reward_models.finetune.offline import start_offline
from reward_models.finetune.trl_runs import lora_config, trl_arguments
from reward_models.finetune.turn_batches import is_messages, row_conversation
from reward_models.policy.turns import encode_conversation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

KIND = "sft_policy"
SOURCES = ("intervention", "takeover", "demonstration")


@dataclass
class SFTConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/sft", metadata={"help": "Where checkpoints and the policy go."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate (linear decay)."})
    num_epochs: float = field(default=2.0, metadata={"help": "At most this many passes over the examples."})
    max_steps: int = field(default=200, metadata={"help": "At most this many optimiser steps."})
    batch_size: int = field(default=16, metadata={"help": "Turns per optimiser step."})
    sources: list[str] = field(
        default_factory=lambda: list(SOURCES), metadata={"help": "Which rows to imitate, by source (comma-separated)."}
    )
    max_length: int = turn_length_field()
    gradient_checkpointing: bool = gradient_checkpointing_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.data_path), "data_path", "is required")
        require(self.num_epochs > 0, "num_epochs", "must be positive")
        require(self.max_length > 1, "max_length", "must be at least 2")
        require(bool(self.sources), "sources", "must name at least one source")
        unknown = sorted(set(self.sources) - set(SOURCES))
        require(not unknown, "sources", f"unknown {', '.join(unknown)}; the sources are {', '.join(SOURCES)}")


def row_problems(rows: Sequence[dict[str, Any]], config: SFTConfig) -> dict[int, str]:
    """The rows of the sources `config` imitates that are no conversation, by number, and why."""
    return bad_rows(rows, lambda row: _row_problem(row, config.sources))


def _row_problem(row: dict[str, Any], sources: Sequence[str]) -> str | None:
    if (row.get("source") or "demonstration") not in sources:
        return None  # not imitated, so never read
    messages = row.get("messages")
    if not is_messages(messages):
        return "'messages' must be a list of messages"
    try:
        row_conversation(messages)
    except ValueError as exc:
        return str(exc)
    return None


def sft_examples(
    rows: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    history_window: int | None,
    sources: Sequence[str],
    max_length: int,
) -> tuple[list[dict[str, list[int]]], Counter[str]]:
    """One pre-tokenized example per imitated turn (``input_ids``, and ``labels`` with -100 on the prompt), and how
    many rows of each source they came from. Rows that are not conversations are a `ConfigError` on ``data_path``
    naming every one of them (`row_problems`)."""
    if problems := bad_rows(rows, lambda row: _row_problem(row, sources)):
        raise rows_error(problems, len(rows))
    examples: list[dict[str, list[int]]] = []
    used: Counter[str] = Counter()
    for row in rows:
        source = row.get("source") or "demonstration"
        if source not in sources:
            continue
        conversation = row_conversation(row["messages"])
        start = row.get("step_index") or 0
        if start >= conversation.num_steps:
            continue
        used[source] += 1
        for encoding in encode_conversation(tokenizer, conversation, row_tools(row), history_window, start):
            completion = encoding.completion_ids[:max_length]
            prompt = encoding.prompt_ids[len(encoding.prompt_ids) - max(max_length - len(completion), 1) :]
            examples.append({"input_ids": prompt + completion, "labels": [-100] * len(prompt) + completion})
    return examples, used


def main(config: SFTConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Imitate the rows of `config.data_path`, evaluate against the starting policy on the held-out tasks and write
    `config.output_dir`; returns the summary (also kept in the manifest)."""
    run = start_offline(config, KIND, reporter)
    if run.finished is not None:
        return run.finished
    rows, tokenizer = run.rows, run.tokenizer
    examples, used = sft_examples(rows, tokenizer, run.settings["history_window"], config.sources, config.max_length)
    if not examples:
        raise ConfigError("data_path", f"no turns to imitate among its {len(rows)} rows (sources: {config.sources})")
    steps = min(config.max_steps, math.ceil(config.num_epochs * len(examples) / config.batch_size))
    run.reporter.log(f"{len(examples)} turns from {sum(used.values())} rows ({dict(used)}), {steps} steps")

    run.start_training()
    trainer = sft_trainer(config, run.policy.model, tokenizer, examples, steps, run.trainer_callbacks())
    model, training, resumed = run.train(trainer)
    return run.finish(
        model, training, resumed, labels_used=sum(used.values()), turns=len(examples), sources=dict(used)
    )


def sft_trainer(
    config: SFTConfig, model: Any, tokenizer: Any, examples: list[dict[str, list[int]]], steps: int, callbacks=()
):
    """TRL's `SFTTrainer` set up for `steps` steps on the pre-tokenized `examples`, with `callbacks`."""
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    peft_config = lora_config(config)
    args = TRLSFTConfig(**trl_arguments(config, steps))
    return without_printer(
        SFTTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(examples),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks),
        )
    )


if __name__ == "__main__":
    cli(SFTConfig, main, __doc__)
