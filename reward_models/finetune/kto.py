"""Kahneman-Tversky optimisation (KTO) of a policy from unpaired ratings and thumbs, turn by turn.

The data is the `unpaired` export: ``prompt`` (the trajectory's prompt: the task and what the agent saw first),
``completion`` (the rest of the trajectory: its turns and what came back after each), ``tools`` and ``label``
(desirable or not). A trajectory is not one completion, so each of its assistant turns is one KTO example with the
trajectory's label and its own prompt: the prompt the policy sees before that turn (`turns.encode_conversation`, with
the row's tools), and the assistant message it wrote, closed by end-of-sequence. The examples reach TRL's
`KTOTrainer` already tokenized, so the loss covers the policy's tokens only; observations and tool results are
prompts and get none.

KTO's reference point is a KL estimate from mismatched turns (each turn's decision scored after another turn's
prompt), built within each batch as TRL builds it; TRL needs a fixed order for that, so the turns are shuffled once
with the seed. With ``balance_weights`` the desirable and undesirable losses are weighted so both kinds of turn
count equally (KTO paper, eq. 8), since rated failures run longer and give more turns than successes.

Weaker than it looks: measured on the bootstrapped gridworld policy (47 % greedy, 52 % sampled success on the 200
held-out tasks) with a thumb on each of 1000 of its own rollouts (up for a success), KTO lowered greedy success in
every setting tried: learning rate 1e-4, β 0.5, 200 steps: 36 % / 43 % (greedy / sampled); β 2: 25 % / 48.5 %;
learning rate 3e-5 (the defaults): 37.5 % / 55.5 %. A failed trajectory's label falls on all its turns, most of them
good moves, and nothing anchors the shared reasoning tokens; per-turn KTO from trajectory ratings needs a better
credit assignment (e.g. a PRM) to help. DPO with an SFT term on interventions (`dpo`) is the method that helps.

Defaults suit the tiny gridworld policy on 2 CPU cores. For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.kto --policy_path var/policies/qwen --data_path unpaired.jsonl \\
        --output_dir var/policies/kto --use_lora true --lora_r 16 --learning_rate 5e-6 --batch_size 8 \\
        --precision bf16 --gradient_checkpointing true

Example::

    from reward_models.finetune.kto import KTOConfig, main

    config = KTOConfig(policy_path="var/policies/bootstrap", data_path="unpaired.jsonl", output_dir="var/policies/kto")
    summary = main(config)
"""

from __future__ import annotations

import math
import random
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
from reward_models.finetune.turn_batches import is_messages, prompt_steps, row_conversation
from reward_models.policy.turns import encode_conversation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

KIND = "kto_policy"


@dataclass
class KTOConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/kto", metadata={"help": "Where checkpoints and the policy go."})
    learning_rate: float = field(default=3e-5, metadata={"help": "Peak learning rate (linear decay)."})
    beta: float = field(default=0.5, metadata={"help": "KTO's beta: higher keeps the policy nearer the reference."})
    balance_weights: bool = field(
        default=True,
        metadata={"help": "Weight desirable and undesirable turns so both kinds count equally (KTO paper, eq. 8)."},
    )
    num_epochs: float = field(default=1.0, metadata={"help": "At most this many passes over the turns."})
    max_steps: int = field(default=100, metadata={"help": "At most this many optimiser steps."})
    batch_size: int = field(default=32, metadata={"help": "Turns per optimiser step (at least 2, for the KL term)."})
    max_length: int = turn_length_field()
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata={
            "help": "Score every turn under the reference once, before training, instead of each batch's turns as it "
            "comes (pays off only when training sees most turns more than once)."
        },
    )
    gradient_checkpointing: bool = gradient_checkpointing_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.data_path), "data_path", "is required")
        require(self.beta > 0, "beta", "must be positive")
        require(self.num_epochs > 0, "num_epochs", "must be positive")
        require(self.batch_size >= 2, "batch_size", "must be at least 2 (KTO's KL estimate mismatches turns)")
        require(self.max_length > 1, "max_length", "must be at least 2")


def row_problems(rows: Sequence[dict[str, Any]], config: KTOConfig) -> dict[int, str]:
    """The rows that are no conversational unpaired row, by number, and why."""
    return bad_rows(rows, _row_problem)


def _row_problem(row: dict[str, Any]) -> str | None:
    for key in ("prompt", "completion"):
        value = row.get(key)
        if not is_messages(value):
            return f"{key!r} must be a list of messages (export the conversational style)"
    if not isinstance(row.get("label"), bool):
        return "'label' must be true or false"
    try:
        row_conversation(row["prompt"] + row["completion"])
    except ValueError as exc:
        return str(exc)
    return None


def kto_examples(
    rows: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    history_window: int | None,
    max_length: int,
) -> tuple[list[dict[str, Any]], int]:
    """One pre-tokenized example per assistant turn (``prompt_ids``, ``completion_ids``, ``label``: the
    trajectory's), and how many rows they came from. Rows that are not conversational unpaired rows are a
    `ConfigError` on ``data_path`` naming every one of them (`row_problems`)."""
    if problems := bad_rows(rows, _row_problem):
        raise rows_error(problems, len(rows))
    examples, used = [], 0
    for row in rows:
        label, prompt = row["label"], row["prompt"]
        conversation = row_conversation(prompt + row["completion"])
        start = prompt_steps(prompt)
        if start >= conversation.num_steps:
            continue
        used += 1
        for encoding in encode_conversation(tokenizer, conversation, row_tools(row), history_window, start):
            completion_ids = encoding.completion_ids[:max_length]
            keep = max(max_length - len(completion_ids), 1)
            examples.append(
                {"prompt_ids": encoding.prompt_ids[-keep:], "completion_ids": completion_ids, "label": label}
            )
    return examples, used


def with_kl_completions(examples: list[dict[str, Any]], batch_size: int) -> list[dict[str, Any]]:
    """Each example with ``KL_completion_ids``: the completions rotated by one within each block of `batch_size`,
    as TRL pairs them, so a batch's KL estimate scores its own completions after its other prompts."""
    result = []
    for start in range(0, len(examples), batch_size):
        block = examples[start : start + batch_size]
        rotated = [block[-1]["completion_ids"]] + [example["completion_ids"] for example in block[:-1]]
        result += [{**example, "KL_completion_ids": kl} for example, kl in zip(block, rotated, strict=True)]
    return result


def main(config: KTOConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train on the ratings of `config.data_path`, evaluate against the starting policy on the held-out tasks and
    write `config.output_dir`; returns the summary (also kept in the manifest)."""
    run = start_offline(config, KIND, reporter)
    if run.finished is not None:
        return run.finished
    examples, used = kto_examples(run.rows, run.tokenizer, run.settings["history_window"], config.max_length)
    desirable = sum(example["label"] for example in examples)
    undesirable = len(examples) - desirable
    if not desirable or not undesirable:
        raise ConfigError("data_path", f"needs desirable and undesirable turns; it has {desirable} and {undesirable}")
    steps = min(config.max_steps, math.ceil(config.num_epochs * len(examples) / config.batch_size))
    # Eq. 8 of the KTO paper: desirable_weight * n_desirable / (undesirable_weight * n_undesirable) in [1, 4/3].
    weights = {"desirable_weight": 1.0, "undesirable_weight": 1.0}
    if config.balance_weights:
        if desirable < undesirable:
            weights["desirable_weight"] = undesirable / desirable
        else:
            weights["undesirable_weight"] = desirable / undesirable
    run.reporter.log(f"{len(examples)} turns ({desirable} desirable) from {used} rows, {steps} steps, {weights}")

    run.start_training()
    random.Random(config.seed).shuffle(examples)
    trainer = kto_trainer(config, run.policy.model, run.tokenizer, examples, steps, weights, run.trainer_callbacks())
    model, training, resumed = run.train(trainer, extra=("kl",))
    return run.finish(
        model,
        training,
        resumed,
        labels_used=used,
        turns=len(examples),
        desirable_turns=desirable,
        undesirable_turns=undesirable,
    )


def kto_trainer(
    config: KTOConfig,
    model: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]],
    steps: int,
    weights: dict[str, float],
    callbacks=(),
):
    """TRL's `KTOTrainer` set up for `steps` steps on the pre-tokenized turn `examples` (in training order), with
    the desirable/undesirable `weights` and `callbacks`."""
    from datasets import Dataset
    from trl import KTOConfig as TRLKTOConfig
    from trl import KTOTrainer

    class TurnKTOTrainer(KTOTrainer):
        # KTOTrainer tokenizes a text or chat prompt itself; ours are the policy's own turn encodings already (with
        # their KL completions), so its preparation, which would re-render and re-tokenize them, is skipped.
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    peft_config = lora_config(config)
    args = TRLKTOConfig(
        **trl_arguments(config, steps),
        beta=config.beta,
        **weights,
        precompute_ref_log_probs=config.precompute_ref_log_probs,
        precompute_ref_batch_size=4 * config.batch_size,  # no gradients: a larger batch fits
    )
    return without_printer(
        TurnKTOTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(with_kl_completions(examples, config.batch_size)),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks),
        )
    )


if __name__ == "__main__":
    cli(KTOConfig, main, __doc__)
