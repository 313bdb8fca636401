"""The reward-model pipeline: the row check Tandem runs before a run, the training of each ensemble member
(resuming from its checkpoints, centring it, scoring the held-out pairs) and `main`, which trains the members,
evaluates them and writes the run directory."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import (
    checkpoint_dir,
    last_checkpoint,
    trained_model,
    write_manifest,
)
from reward_models.common.data import bad_rows, row_tools, split_comparisons
from reward_models.common.judge_config import start_judge
from reward_models.common.reporting import Reporter, trainer_callback, without_printer
from reward_models.common.runtime import judge_trainer_args, lora_settings, timed_training
from reward_models.reward.config import (
    CENTRING_SAMPLE,
    CHECKPOINT_OWNER_FILE,
    KIND,
    MEMBER_FILE,
    MEMBERS_DIR,
    RewardConfig,
)
from reward_models.reward.encoding import encode, fit_length, load_tokenizer, row_in_layout
from reward_models.reward.metrics import mean, pairwise_metrics
from reward_models.reward.model import model_pad_id, rewards

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class _Pairs:
    """A split's rows, tokenised once: what `datasets` gets, and what evaluation scores."""

    rows: list[dict[str, Any]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    length_gaps: list[int]
    truncated: int


def _encode_rows(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], max_length: int) -> _Pairs:
    chosen_ids, rejected_ids, gaps, truncated = [], [], [], 0
    for row in rows:
        chosen = encode(tokenizer, row["prompt"], row["chosen"], row_tools(row))
        rejected = encode(tokenizer, row["prompt"], row["rejected"], row_tools(row))
        gaps.append(len(chosen) - len(rejected))
        truncated += len(chosen) > max_length or len(rejected) > max_length
        chosen_ids.append(fit_length(chosen, max_length))
        rejected_ids.append(fit_length(rejected, max_length))
    return _Pairs(rows, chosen_ids, rejected_ids, gaps, truncated)


def row_problems(rows: Sequence[dict[str, Any]], config: RewardConfig) -> dict[int, str]:
    """The rows the reward model cannot learn from, by number, and why."""
    return bad_rows(rows, preference_row_problem)


def preference_row_problem(row: dict[str, Any]) -> str | None:
    """Why a `preference` row is no comparison a pairwise judge can read, or None: it needs a prompt, chosen and
    rejected, all text or all message lists."""
    for column in ("prompt", "chosen", "rejected"):
        if not row.get(column):
            return f"it has no {column!r} (a preference export has prompt, chosen, rejected)"
    if len({isinstance(row[column], str) for column in ("prompt", "chosen", "rejected")}) > 1:
        return "it mixes text and message lists"
    return None


class _MemberReporter:
    """Member i of K reports its steps as steps i*n+1 .. (i+1)*n of one run of K*n steps."""

    def __init__(self, reporter: Reporter, member: int, members: int) -> None:
        self.reporter, self.member, self.members, self.steps = reporter, member, members, 0

    def progress(self, current: int, total: int, phase: str = "") -> None:
        if phase:
            self.reporter.progress(current, total, phase)
            return
        self.steps = total
        self.reporter.progress(self.member * total + current, self.members * total)

    def metric(self, step: int, **values: float) -> None:
        self.reporter.metric(self.member * self.steps + step, member=self.member, **values)

    def log(self, line: str) -> None:
        self.reporter.log(line)


def _train_member(
    config: RewardConfig,
    member: int,
    train: _Pairs,
    evaluation: _Pairs,
    tokenizer: PreTrainedTokenizerBase,
    precision: str,
    reporter: Reporter,
) -> tuple[dict[str, Any], str | None]:
    """Train, centre, score the held-out pairs with and save ensemble member `member`; returns its record (also
    written as its ``tandem_member.json``) and the checkpoint it resumed from."""
    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from trl import RewardConfig as TRLRewardConfig

    from reward_models.reward.trainer import TandemRewardTrainer

    output_dir = Path(config.output_dir)
    seed = config.seed + member
    n = len(train.rows)
    if config.ensemble_mode == "bootstrap":
        sampler = random.Random(seed)
        indices = [sampler.randrange(n) for _ in range(n)]
    else:
        indices = list(range(n))
    columns: dict[str, list[Any]] = {
        "chosen_ids": [train.chosen_ids[i] for i in indices],
        "rejected_ids": [train.rejected_ids[i] for i in indices],
    }
    if config.use_margin:
        columns["margin"] = [float(train.rows[i].get("margin") or 0.0) for i in indices]
    if config.ties == "tie_loss":
        columns["tie"] = [bool(train.rows[i].get("tie")) for i in indices]

    # Checkpoints belong to the member being trained; ones left by another member (a crash between saving a member
    # and clearing its checkpoints) must not be resumed.
    checkpoints = checkpoint_dir(output_dir)
    owner_file = checkpoints / CHECKPOINT_OWNER_FILE
    state = PartialState()  # under `accelerate launch`, one process writes files and the others wait
    if state.is_main_process:
        if owner_file.is_file() and json.loads(owner_file.read_text())["member"] != member:
            shutil.rmtree(checkpoints)
        checkpoints.mkdir(parents=True, exist_ok=True)
        owner_file.write_text(json.dumps({"member": member}) + "\n")
    state.wait_for_everyone()
    resume = last_checkpoint(output_dir)

    peft_config, model_init_kwargs = None, None
    if config.use_lora:
        peft_config = lora_settings(config.lora_r, "SEQ_CLS")
        if precision == "bf16":
            # The frozen base in bf16 is what makes LoRA fit a 7-8B model on one GPU; peft keeps the adapters fp32.
            model_init_kwargs = {"dtype": torch.bfloat16}
    args = TRLRewardConfig(
        output_dir=str(checkpoints),
        model_init_kwargs=model_init_kwargs,
        **judge_trainer_args(config, precision, seed),  # rows already cut to max_length by fit_length
    )
    member_reporter = (
        reporter if config.ensemble_size == 1 else _MemberReporter(reporter, member, config.ensemble_size)
    )
    trainer = without_printer(
        TandemRewardTrainer(
            model=config.base_model,
            args=args,
            train_dataset=Dataset.from_dict(columns),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[trainer_callback(member_reporter)],
        )
    )
    if resume:
        reporter.log(f"member {member}: resuming from {resume}")
    reporter.log(f"member {member}: training on {n} pairs ({len(set(indices))} distinct), seed {seed}")
    seconds, samples = timed_training(trainer, resume, config)

    model = trained_model(trainer.accelerator, trainer.model)
    model = model.merge_and_unload() if config.use_lora else model
    pad_id = model_pad_id(model)
    offset = 0.0
    if config.ensemble_size > 1:  # one model's scores need no common zero: only their differences mean anything
        centring = random.Random(seed).sample(indices, min(len(indices), CENTRING_SAMPLE // 2))
        sample = [train.chosen_ids[i] for i in centring] + [train.rejected_ids[i] for i in centring]
        offset = mean(rewards(model, sample, pad_id, config.batch_size))
    eval_chosen = rewards(model, evaluation.chosen_ids, pad_id, config.batch_size)
    eval_rejected = rewards(model, evaluation.rejected_ids, pad_id, config.batch_size)
    record = {
        "member": member,
        "seed": seed,
        "offset": offset,
        "train_pairs": n,
        "distinct_pairs": len(set(indices)),
        "data_digest": hashlib.sha256(json.dumps(sorted(indices)).encode()).hexdigest()[:16],
        "steps": trainer.state.global_step,
        "train_seconds": seconds,
        "trained_samples": samples,
        "eval_differences": [c - r for c, r in zip(eval_chosen, eval_rejected, strict=True)],
    }
    member_dir = output_dir / MEMBERS_DIR / str(member)
    if trainer.args.should_save:
        partial = member_dir.with_name(member_dir.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        (partial / MEMBER_FILE).write_text(json.dumps(record) + "\n")
        partial.replace(member_dir)
        shutil.rmtree(checkpoints)
    trainer.accelerator.wait_for_everyone()
    return record, resume


def main(config: RewardConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train the reward model (or ensemble) on `config.data_path`, evaluate it on the held-out tasks and write
    `config.output_dir`; returns the summary (also kept in the manifest)."""
    start = start_judge(config, KIND, "reward model", row_problems, reporter)
    if start.finished is not None:
        return start.finished
    reporter, precision, local, rows = start.reporter, start.precision, start.local, start.rows
    style = start.style
    rows = [row_in_layout(row, config.layout) for row in rows]
    train_rows, eval_rows, dropped_ties = split_comparisons(rows, config)
    from accelerate import PartialState

    tokenizer = load_tokenizer(local.base_model)
    train = _encode_rows(tokenizer, train_rows, config.max_length)
    evaluation = _encode_rows(tokenizer, eval_rows, config.max_length)
    reporter.log(
        f"{len(train_rows)} training pairs ({dropped_ties} ties dropped), {len(eval_rows)} held out, "
        f"{train.truncated + evaluation.truncated} cut to {config.max_length} tokens; precision {precision}"
    )

    records, resumed_from = [], None
    for member in range(config.ensemble_size):
        member_file = Path(config.output_dir) / MEMBERS_DIR / str(member) / MEMBER_FILE
        if member_file.is_file():
            reporter.log(f"member {member}: already trained")
            records.append(json.loads(member_file.read_text()))
            continue
        record, resume = _train_member(local, member, train, evaluation, tokenizer, precision, reporter)
        records.append(record)
        resumed_from = resumed_from or resume

    metrics = (
        pairwise_metrics([r["eval_differences"] for r in records], eval_rows, evaluation.length_gaps, config.ece_bins)
        if eval_rows
        else {}
    )
    train_seconds = sum(record["train_seconds"] for record in records)
    trained_samples = sum(record["trained_samples"] for record in records)
    summary = {
        "metrics": metrics,
        "train_samples": len(train_rows),
        "eval_samples": len(eval_rows),
        "dropped_ties": dropped_ties,
        "truncated_pairs": train.truncated + evaluation.truncated,
        "train_seconds": train_seconds,
        "samples_per_second": trained_samples / train_seconds if train_seconds else 0.0,
        "output_dir": str(config.output_dir),
        "resumed_from": resumed_from,
        "members": [{key: value for key, value in record.items() if key != "eval_differences"} for record in records],
    }
    if PartialState().is_main_process:
        write_manifest(
            config.output_dir,
            kind=KIND,
            config=config,
            metrics=metrics,
            summary=summary,
            members=[f"{MEMBERS_DIR}/{member}" for member in range(config.ensemble_size)],
            precision=precision,
            style=style,
        )
    if metrics:
        reporter.log(
            f"held out: accuracy {metrics.get('accuracy', float('nan')):.3f}, "
            f"log-loss {metrics.get('log_loss', float('nan')):.3f}, ECE {metrics.get('ece', float('nan')):.3f}"
        )
    return summary
