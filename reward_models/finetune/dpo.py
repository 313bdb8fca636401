"""Direct preference optimisation (DPO) of a policy from preference pairs, on the policy's own tokens only.

Two levels (``level``):

- ``step``: `step_preference` rows (an intervention's correction over the original step, or two branches of one
  tree), through TRL's `DPOTrainer`. A row is a shared prefix (every message before the assistant message of the
  step where the two sides part), then the chosen and the rejected assistant message. The prompt is exactly the
  policy's own turn prompt (`turns.encode_conversation`: the conversation so far through its history window,
  rendered by its chat template with the row's tools) and each completion is the step as the policy writes it,
  closed by end-of-sequence: the pairs reach `DPOTrainer` already tokenized, so what is trained is token for token
  what the policy generates. Where a side continues past the step (a branch comparison), only the step where they
  part is trained at this level.
- ``trajectory``: whole-trajectory `preference` rows (or `step_preference` rows with multi-turn continuations), through
  our own `accelerate` loop, since a trajectory is not one prompt and one completion: a side's log-probability is the
  sum over its turns of the completion log-probabilities (`turn_batches.completion_logprobs` over
  `turns.encode_conversation`), and the observations and tool results between the turns are prompts, never targets.
  Turns of a shared prefix would cancel out of the DPO margin, so only the turns after it are scored.

What makes DPO on intervention pairs help rather than hurt, measured on the bootstrapped gridworld policy (47 %
greedy, 52 % sampled success on the 200 held-out tasks) with 859 oracle interventions on its own sampled rollouts of
1000 training tasks (held-out success after training, greedy / sampled, paired standard errors about 3 points):

- plain DPO (β 0.1, learning rate 5e-4, no SFT term): 13.5 % / 22 %. Both the chosen and the rejected step lose
  likelihood (the chosen step's log-probability falls from -3 to -15): the policy unlearns its own reasoning.
- balancing the pairs per action alone does not cure that: 0.5 % / 1 %. (On these pairs the actions were only mildly
  lopsided; balancing keeps 783 of 859.)
- a low learning rate (1e-4) and β 0.5 stop the collapse but still cost greedy success: 42 % / 59 %.
- adding an SFT term on the chosen step (``sft_weight`` 1, RPO) is what makes it help: 51 % / 67.5 % with balancing
  (the defaults), 52.5 % / 64 % without. SFT on the same corrections alone gives 46.5 % / 62.5 %.

So by default the pairs are balanced per action (``balance="action"``: every action is chosen as often as it is
rejected, so no action is learnt to be bad everywhere; `balance_by_action` says how), an SFT term on the chosen step
is added (``sft_weight``; TRL's ``"sft"`` loss beside ``"sigmoid"``), the learning rate is 1e-4 and β 0.5, for at
most two epochs. The summary's metrics say how many pairs were used and how many were dropped, and why (ties, and
pairs balancing left out).

Defaults suit the tiny gridworld policy on 2 CPU cores (about 100 steps: 2-3 minutes). For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.dpo --policy_path var/policies/qwen --data_path step_preference.jsonl \\
        --output_dir var/policies/dpo --use_lora true --lora_r 16 --learning_rate 5e-6 --batch_size 8 \\
        --precision bf16 --gradient_checkpointing true

Example::

    from reward_models.finetune.dpo import DPOConfig, main

    summary = main(DPOConfig(policy_path="var/policies/bootstrap", data_path="step_preference.jsonl",
                             output_dir="var/policies/dpo"))
    summary["metrics"]["final"]["greedy_success"]
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reward_models.common.artifacts import checkpoint_dir, trained_model
from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, choice, require
from reward_models.common.data import bad_rows
from reward_models.common.reporting import Reporter, without_printer
from reward_models.common.runtime import lora_settings
from reward_models.finetune.config import (
    PolicyTrainConfig,
    environment_factory,
    gradient_checkpointing_field,
    turn_length_field,
)
from reward_models.finetune.dpo_pairs import (
    PreferencePair,
    action_counts,
    action_key,
    balance_by_action,
    pair_row_problem,
    preference_pairs,
    trained_sides,
)
from reward_models.finetune.loops import (
    make_accelerator,
    out_of_time,
    process_share,
    resume_loop_checkpoint,
    save_loop_checkpoint,
)
from reward_models.finetune.offline import OfflineRun, start_offline
from reward_models.finetune.policy_model import load_policy_model
from reward_models.finetune.trl_runs import lora_config, trl_arguments
from reward_models.finetune.turn_batches import pad_turns, token_logprobs

KIND = "dpo_policy"
LEVELS = ("step", "trajectory")
BALANCES = ("none", "action")


@dataclass
class DPOConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/dpo", metadata={"help": "Where checkpoints and the policy go."})
    level: str = choice(
        "step", LEVELS, "step: step_preference pairs through TRL's DPOTrainer; trajectory: whole trajectories."
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate (linear decay)."})
    beta: float = field(default=0.5, metadata={"help": "DPO's beta: higher keeps the policy nearer the reference."})
    sft_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of an SFT term (mean NLL of the chosen tokens) beside the DPO loss; 0: plain DPO."},
    )
    balance: str = choice(
        "action",
        BALANCES,
        "action: keep a subset in which every action seen more than once is as often chosen as rejected "
        "(step level); none: every pair.",
    )
    num_epochs: float = field(default=2.0, metadata={"help": "At most this many passes over the pairs."})
    max_steps: int = field(default=200, metadata={"help": "At most this many optimiser steps."})
    batch_size: int = field(default=16, metadata={"help": "Pairs per optimiser step."})
    max_length: int = turn_length_field()
    precompute_ref_log_probs: bool = field(
        default=True, metadata={"help": "Score the pairs under the reference once, before training (no second model)."}
    )
    gradient_checkpointing: bool = gradient_checkpointing_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.data_path), "data_path", "is required")
        require(self.beta > 0, "beta", "must be positive")
        require(self.sft_weight >= 0, "sft_weight", "must be 0 or positive")
        require(self.num_epochs > 0, "num_epochs", "must be positive")
        require(self.max_length > 1, "max_length", "must be at least 2")


# --- pairs ---------------------------------------------------------------------------------------------------------


def row_problems(rows: Sequence[dict[str, Any]], config: DPOConfig) -> dict[int, str]:
    """The rows that are no conversational pair at `config.level`, by number, and why. Ties are no problem: they are
    left out (`preference_pairs`)."""
    return bad_rows(rows, lambda row: pair_row_problem(row, config.level))


def pair_counts(rows: Sequence[dict[str, Any]], config: DPOConfig) -> dict[str, int]:
    """What a run with `config` makes of `rows`, before it loads a model (`row_problems` must find none): ``rows``,
    ``ties`` (no preference, left out), ``pairs``, ``unbalanced`` (left out by ``balance="action"``), ``used`` and
    the optimiser ``steps`` they make. `main` reports the same counts."""
    env = environment_factory(config)()
    pairs = [
        PreferencePair([], [], action_key(env, chosen[0]), action_key(env, rejected[0]))
        for row in rows
        if not row.get("tie")
        for chosen, rejected in [trained_sides(row, config.level)]
    ]
    return _counts(len(rows), len(pairs), len(_balanced(pairs, config)), config)


def _balanced(pairs: Sequence[PreferencePair], config: DPOConfig) -> list[PreferencePair]:
    if config.balance == "action" and config.level == "step":  # a trajectory is no one action
        return balance_by_action(pairs, config.seed)
    return list(pairs)


def _counts(rows: int, pairs: int, used: int, config: DPOConfig) -> dict[str, int]:
    return {
        "rows": rows,
        "ties": rows - pairs,
        "pairs": pairs,
        "unbalanced": pairs - used,
        "used": used,
        "steps": min(config.max_steps, math.ceil(config.num_epochs * used / config.batch_size)),
    }


def describe_counts(counts: dict[str, int], config: DPOConfig) -> str:
    """`pair_counts` in words: which pairs train and why the others do not."""
    parts = [f"{counts['used']} of {counts['rows']} rows train as pairs"]
    if counts["ties"]:
        parts.append(f"{counts['ties']} are ties (no preference)")
    if counts["unbalanced"]:
        parts.append(
            f"{counts['unbalanced']} are left out by balance=action (every action must be chosen as often as it is "
            "rejected)"
        )
    steps = counts["steps"]
    return f"{'; '.join(parts)}: {steps} optimiser step{'s' if steps != 1 else ''} of {config.batch_size} pairs"


# --- main ----------------------------------------------------------------------------------------------------------


def main(config: DPOConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train the policy on the pairs of `config.data_path`, evaluate it against the starting policy on the held-out
    tasks and write `config.output_dir`; returns the summary (also kept in the manifest)."""
    # Dropout off, as TRL's DPO trainer has it: the reference's log-probabilities are taken without it, so a policy
    # scored with it would start with margins that are noise.
    run = start_offline(config, KIND, reporter, dropout=False)
    if run.finished is not None:
        return run.finished
    rows = run.rows
    pairs = preference_pairs(
        rows, run.tokenizer, run.settings["history_window"], config.level, environment_factory(config)()
    )
    available = len(pairs)
    pairs = _balanced(pairs, config)
    counts = _counts(len(rows), available, len(pairs), config)
    if not pairs:
        raise ConfigError("data_path", f"no usable preference pairs: {describe_counts(counts, config)}")
    steps = counts["steps"]
    run.reporter.log(f"{describe_counts(counts, config)}, at the {config.level} level")

    run.start_training()
    train = _train_steps if config.level == "step" else _train_trajectories
    model, training, resumed = train(run, pairs, steps)
    return run.finish(
        model,
        training,
        resumed,
        extra_metrics=counts,
        labels_used=len(pairs),
        pairs_available=available,
        pair_counts=counts,
        action_counts=action_counts(pairs),
    )


def step_trainer(
    config: DPOConfig, model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], steps: int, callbacks=()
):
    """TRL's `DPOTrainer` set up for `steps` steps on the step-level `pairs`, given as token ids (the policy's own
    prompt and completions), with `callbacks`."""
    from datasets import Dataset
    from trl import DPOConfig as TRLDPOConfig
    from trl import DPOTrainer

    class TurnDPOTrainer(DPOTrainer):
        # DPOTrainer tokenizes a text or chat prompt itself; ours are the policy's own turn encodings already, so
        # its preparation (which would re-render and re-tokenize them) is skipped. The collator pads them as is.
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    records = []
    for pair in pairs:
        chosen, rejected = pair.chosen[0], pair.rejected[0]
        prompt = _cut_prompt(chosen.prompt_ids, max(len(chosen.completion_ids), len(rejected.completion_ids)), config)
        records.append(
            {
                "prompt_ids": prompt,
                "chosen_ids": chosen.completion_ids[: config.max_length],
                "rejected_ids": rejected.completion_ids[: config.max_length],
            }
        )
    peft_config = lora_config(config)
    reference = None
    if config.reference != config.policy_path:
        reference = load_policy_model(config.reference, trainable=False, field_name="reference_path").model
    args = TRLDPOConfig(
        **trl_arguments(config, steps),
        beta=config.beta,
        loss_type=["sigmoid", "sft"] if config.sft_weight else ["sigmoid"],
        loss_weights=[1.0, config.sft_weight] if config.sft_weight else None,
        precompute_ref_log_probs=config.precompute_ref_log_probs,
        precompute_ref_batch_size=4 * config.batch_size,  # no gradients: a larger batch fits
    )
    return without_printer(
        TurnDPOTrainer(
            model=model,
            ref_model=reference,
            args=args,
            train_dataset=_shared_dataset(Dataset.from_list(records), config),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=list(callbacks),
        )
    )


def _shared_dataset(dataset: Any, config: DPOConfig) -> Any:
    """`dataset` as every process can read it. TRL caches the precomputed reference log-probabilities beside the
    dataset's files, where the main process writes them and the others read them; an in-memory dataset has its
    files in a temporary folder of each process, so under several processes it goes into the run's checkpoint
    folder first."""
    from accelerate import PartialState
    from datasets import load_from_disk

    state = PartialState()
    if state.num_processes == 1:
        return dataset
    folder = checkpoint_dir(config.output_dir) / "step-pairs"
    if state.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)  # an earlier attempt's copy and its cache go
        dataset.save_to_disk(folder)
    state.wait_for_everyone()
    return load_from_disk(str(folder))


def _train_steps(run: OfflineRun, pairs: Sequence[PreferencePair], steps: int):
    """Step-level DPO through TRL's `DPOTrainer`, on the pairs as token ids."""
    trainer = step_trainer(run.config, run.policy.model, run.tokenizer, pairs, steps, run.trainer_callbacks())
    return run.train(trainer, extra=("rewards/accuracies", "rewards/margins"))


def _cut_prompt(prompt_ids: list[int], completion_length: int, config: DPOConfig) -> list[int]:
    """The prompt's last tokens, so that it and the longest completion fit `max_length` (oldest history first)."""
    keep = max(config.max_length - completion_length, 1)
    return list(prompt_ids[-keep:])


# --- trajectory level ----------------------------------------------------------------------------------------------


def _train_trajectories(run: OfflineRun, pairs: Sequence[PreferencePair], steps: int):
    """Multi-turn DPO: each side's log-probability is the sum of its turns' completion log-probabilities."""
    import torch
    import torch.nn.functional as F
    from transformers import get_linear_schedule_with_warmup

    config, reporter, started = run.config, run.reporter, run.started
    model, tokenizer = run.policy.model, run.tokenizer
    accelerator = make_accelerator(config)
    if config.use_lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_settings(config.lora_r))
    if config.gradient_checkpointing:
        model.activation_checkpointing_enable()
    pad_token_id = tokenizer.pad_token_id

    reference_logps = _reference_logps(config, model, pairs, pad_token_id, accelerator)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(0.1 * steps), steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    start, state, resumed = resume_loop_checkpoint(accelerator, config)
    if resumed is not None:
        reporter.log(f"resuming from {resumed} (step {start})")
    history: list[dict[str, float]] = state.get("history", [])

    model.train()
    step = start
    while step < steps and not out_of_time(config, started):
        indices = _batch_indices(len(pairs), config.batch_size, step, config.seed)
        indices = process_share(accelerator, indices)
        with accelerator.autocast():
            chosen, chosen_tokens, rejected = sequence_logprobs(
                model, [pairs[i] for i in indices], pad_token_id, config.max_length
            )
        ref = reference_logps[indices]
        margin = (chosen - ref[:, 0]) - (rejected - ref[:, 1])
        dpo_loss = -F.logsigmoid(config.beta * margin).mean()
        sft_loss = -chosen.sum() / chosen_tokens
        loss = dpo_loss + config.sft_weight * sft_loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        reporter.progress(step, steps)
        if step % config.logging_steps == 0 or step == steps:
            figures = {
                "loss": loss.item(),
                "dpo_loss": dpo_loss.item(),
                "sft_loss": sft_loss.item(),
                "rewards_accuracies": (margin > 0).float().mean().item(),
                "rewards_margins": config.beta * margin.mean().item(),
            }
            history.append({"step": step, **figures})
            reporter.metric(step, **figures)
        if step % config.save_steps == 0 and step < steps:
            save_loop_checkpoint(accelerator, config, step, {"history": history})
    training: dict[str, Any] = {"steps": step}
    if history:
        training["first_loss"], training["last_loss"] = history[0]["loss"], history[-1]["loss"]
        training["rewards_accuracies"] = history[-1]["rewards_accuracies"]
        training["rewards_margins"] = history[-1]["rewards_margins"]
    return trained_model(accelerator, model), training, resumed


def _batch_indices(count: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The pairs of optimiser step `step`: epochs of seeded shuffles, so a resumed run draws the same batches."""
    import torch

    per_epoch = max(count // batch_size, 1)
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed * 7919 + epoch)).tolist()
    return order[position * batch_size : (position + 1) * batch_size]


def sequence_logprobs(model, pairs, pad_token_id, max_length):
    """(chosen, number of chosen tokens, rejected): each side's summed log-probability over all its turns."""
    import torch

    turns = [turn for pair in pairs for turn in pair.chosen] + [turn for pair in pairs for turn in pair.rejected]
    owners = [i for i, pair in enumerate(pairs) for _ in pair.chosen]
    owners += [len(pairs) + i for i, pair in enumerate(pairs) for _ in pair.rejected]
    batch = pad_turns(turns, pad_token_id, max_length).to(model.device)
    per_turn = token_logprobs(model, batch).sum(dim=-1)
    sides = torch.zeros(2 * len(pairs), dtype=per_turn.dtype, device=per_turn.device)
    sides = sides.index_add(0, torch.tensor(owners, device=per_turn.device), per_turn)
    chosen_tokens = batch.completion_mask[: sum(len(pair.chosen) for pair in pairs)].sum()
    return sides[: len(pairs)], chosen_tokens.clamp(min=1), sides[len(pairs) :]


def _reference_logps(config, model, pairs, pad_token_id, accelerator):
    """(pairs, 2): the reference policy's log-probability of each side, computed once before training, under the
    policy's autocast: a reference equal to the policy then gives exactly its log-probabilities, and every margin
    starts at 0."""
    import torch

    device = accelerator.device
    if config.reference != config.policy_path:
        reference = load_policy_model(
            config.reference, trainable=False, device=str(device), field_name="reference_path"
        ).model
    else:
        reference = model.to(device)
    was_training = reference.training
    reference.eval()
    rows = []
    with torch.no_grad(), accelerator.autocast():
        for start in range(0, len(pairs), config.batch_size):
            chosen, _, rejected = sequence_logprobs(
                reference, pairs[start : start + config.batch_size], pad_token_id, config.max_length
            )
            rows.append(torch.stack([chosen, rejected], dim=1).float())
    reference.train(was_training)
    return torch.cat(rows).to(device)


if __name__ == "__main__":
    cli(DPOConfig, main, __doc__)
