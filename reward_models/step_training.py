"""Training a per-step head (`reward_models.steps`): what the process reward model (`reward_models.prm`) and the
value critic (`reward_models.value`) share in training. Both fit a token-classification head to their training rows'
step targets with the transformers `Trainer`, checkpointing and resuming in the output directory, write it there as
an ordinary Hugging Face directory, and end with the same summary and manifest."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import checkpoint_dir, last_checkpoint, trained_model, write_manifest
from reward_models.common.data import row_tools
from reward_models.common.reporting import Reporter, trainer_callback, without_printer
from reward_models.common.runtime import lora_settings, resolve_precision, seed_everything, trainer_precision_args
from reward_models.steps import StepCollator, StepHeadConfig, prepare_tokenizer, training_examples

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer


@dataclass
class TrainedHead:
    trainer: Trainer
    resumed_from: str | None
    steps_run: int
    train_seconds: float

    @property
    def samples_per_second(self) -> float:
        args = self.trainer.args
        samples = self.steps_run * args.per_device_train_batch_size * args.world_size
        return samples / self.train_seconds if self.train_seconds > 0 else 0.0


def train_step_head(
    config: StepHeadConfig,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[dict[str, list]],
    *,
    id2label: dict[int, str],
    style: str,
    reporter: Reporter,
    compute_loss_func: Callable[..., torch.Tensor] | None = None,
) -> TrainedHead:
    """Train ``AutoModelForTokenClassification`` from `config.base_model` with one output per label in `id2label` on
    `examples` (made from rows of `style`, which the saved head records) with the transformers `Trainer` (accelerate
    underneath), checkpointing into ``checkpoint_dir(output_dir)`` and resuming from the last checkpoint there. With
    one label the head regresses (pass `regression_loss`); otherwise the model's own cross-entropy trains it.
    Exceptions from the reporter stop training and propagate."""
    from transformers import AutoModelForTokenClassification, Trainer, TrainingArguments

    precision = resolve_precision(config.precision)
    seed_everything(config.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        config.base_model, num_labels=len(id2label), id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    # A head reads every position in one pass; a decoder's KV cache would only cost memory.
    model.config.use_cache = False
    model.config.step_separator = config.step_separator
    model.config.step_max_length = config.max_length
    model.config.step_style = style
    if config.use_lora:
        from peft import get_peft_model

        # TOKEN_CLS keeps the new head (`score` / `classifier`) fully trainable beside the adapters, which go on
        # peft's default modules for the architecture (attention projections).
        model = get_peft_model(model, lora_settings(config.lora_r, "TOKEN_CLS"))
    args = TrainingArguments(
        output_dir=str(checkpoint_dir(config.output_dir)),
        num_train_epochs=config.num_epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        seed=config.seed,
        save_strategy="steps",
        save_steps=config.save_steps,
        logging_steps=config.logging_steps,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **trainer_precision_args(precision),
    )
    trainer = without_printer(
        Trainer(
            model=model,
            args=args,
            data_collator=StepCollator(tokenizer.pad_token_id, regression=len(id2label) == 1),
            train_dataset=list(examples),
            processing_class=tokenizer,
            compute_loss_func=compute_loss_func,
            callbacks=[trainer_callback(reporter)],
        )
    )
    resumed_from = last_checkpoint(config.output_dir)
    if resumed_from:
        reporter.log(f"resuming from {resumed_from}")
    started = time.monotonic()
    start_step = int(Path(resumed_from).name.rsplit("-", 1)[1]) if resumed_from else 0
    trainer.train(resume_from_checkpoint=resumed_from)
    seconds = time.monotonic() - started
    return TrainedHead(trainer, resumed_from, trainer.state.global_step - start_step, seconds)


def save_head(head: TrainedHead, config: StepHeadConfig) -> PreTrainedModel:
    """Write the trained model (LoRA adapters merged into it) and tokenizer to `config.output_dir` as an ordinary
    HF directory; returns the model that was written, for evaluation."""
    trainer = head.trainer
    model = trained_model(trainer.accelerator, trainer.model)
    if config.use_lora:
        model = model.merge_and_unload()
    if trainer.is_world_process_zero():
        model.save_pretrained(config.output_dir)
        trainer.processing_class.save_pretrained(config.output_dir)
    return model


def loss_history(trainer: Trainer) -> list[float]:
    """The training losses the Trainer logged, in order."""
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@dataclass
class FittedHead:
    """A per-step head trained on a judge's training rows and written to its output directory (`fit_step_head`):
    the training run, the model as written (in eval mode) with its tokenizer, and how many examples (step windows)
    and trajectories it trained on."""

    run: TrainedHead
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    train_samples: int
    train_trajectories: int


def fit_step_head(
    config: StepHeadConfig,
    rows: Sequence[Mapping[str, Any]],
    targets: Sequence[Sequence[float]],
    *,
    id2label: dict[int, str],
    style: str,
    reporter: Reporter,
    compute_loss_func: Callable[..., torch.Tensor] | None = None,
) -> FittedHead:
    """Train a per-step head from `config.base_model` (a local directory) on the trajectories of `rows` (their
    ``prompt``, ``completions`` and ``tools``), each step labelled with its entry of `targets` (one sequence per row),
    and write it to `config.output_dir` (`train_step_head`, then `save_head`): how the process reward model and the
    value critic train, whatever their targets."""
    from transformers import AutoTokenizer

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(config.base_model))
    trajectories = [
        (row["prompt"], row["completions"], row_targets) for row, row_targets in zip(rows, targets, strict=True)
    ]
    examples = training_examples(
        tokenizer, trajectories, config.step_separator, config.max_length, [row_tools(row) for row in rows]
    )
    run = train_step_head(
        config,
        tokenizer,
        examples,
        id2label=id2label,
        style=style,
        reporter=reporter,
        compute_loss_func=compute_loss_func,
    )
    model = save_head(run, config)
    model.eval()
    return FittedHead(run, model, tokenizer, len(examples), len(rows))


def finish_step_head(
    head: FittedHead,
    config: StepHeadConfig,
    kind: str,
    metrics: dict[str, float],
    reporter: Reporter,
    **counts: Any,
) -> dict[str, Any]:
    """The run's summary, also written with `metrics` into the manifest of `config.output_dir` (by the first
    process): the held-out `metrics`, reported first as ``eval_*`` figures at the last step when there are any; how
    many examples and trajectories trained; `counts`, the judge's own counts, in their order; and the training
    run's figures."""
    trainer = head.run.trainer
    if metrics:
        reporter.metric(trainer.state.global_step, **{f"eval_{name}": value for name, value in metrics.items()})
    losses = loss_history(trainer)
    summary = {
        "metrics": metrics,
        "train_samples": head.train_samples,
        "train_trajectories": head.train_trajectories,
        **counts,
        "train_seconds": head.run.train_seconds,
        "samples_per_second": head.run.samples_per_second,
        "global_step": trainer.state.global_step,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "output_dir": config.output_dir,
        "resumed_from": head.run.resumed_from,
    }
    if trainer.is_world_process_zero():
        write_manifest(config.output_dir, kind=kind, config=config, metrics=metrics, summary=summary)
    reporter.log(f"wrote {config.output_dir}")
    return summary
