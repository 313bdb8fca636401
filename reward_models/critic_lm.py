"""Generative critic: a causal LM fine-tuned on annotators' critiques, through TRL's `SFTTrainer`, that writes a
critique of a trajectory (or of one step of it) for the annotator UI to show as an assist.

It trains on Tandem's `critiques` export: ``prompt`` asks for a critique of a transcript (a message list, or text
with ``style=text``) and ``completion`` is the annotator's critique (an assistant message list, or text). The loss is
on the critique's tokens only (TRL's ``completion_only_loss``), ending at EOS so the critic learns to stop.

- Encoding (`reward_models.critique_encoding`): conversational rows go through the tokenizer's chat template (with the
  row's ``tools``, where it has any) exactly as TRL's prompt-completion preparation does (the prompt with the
  generation prompt; the completion is what prompt + completion adds); a tokenizer without a chat template gets the
  ``Role: content`` transcript (`turns.render_prompt`). We tokenise ourselves and hand `SFTTrainer` ``input_ids`` +
  ``completion_mask``, for one reason: length. TRL keeps the start of an over-long example, which cuts the critique off
  (or drops the example when the prompt alone is too long); here the critique is kept and the transcript is cut in the
  middle, keeping the task and first observation and the steps nearest the request. `critique()` prompts the model
  through the same function, so training and use see the same text.
- LoRA (``use_lora``, through peft) trains adapters on the attention projections only; the adapters are MERGED into
  the saved weights, so the artifact is an ordinary causal-LM directory either way (transformers, vLLM or
  `load_generative_critic` load it with nothing else).
- Evaluation on held-out tasks (`split_by_task`): the completion loss and perplexity of the fine-tuned model beside
  the base model's, token accuracy, and `num_samples` greedy critiques of held-out prompts with their references,
  for the run page.

The run directory::

    output_dir/tandem_artifact.json      manifest: config, metrics, summary (with the samples)
    output_dir/model.safetensors, config.json, generation_config.json, tokenizer files
    output_dir/checkpoints/checkpoint-N  for resume; removed once the model and manifest are written

Defaults suit a tiny model on a CPU. For a 0.5-8B model on a GPU::

    python -m reward_models.critic_lm --data_path critiques.jsonl --base_model Qwen/Qwen2.5-0.5B-Instruct \\
        --output_dir var/models/critic --precision bf16 --learning_rate 2e-5 --batch_size 4 \\
        --gradient_accumulation_steps 8 --gradient_checkpointing true --max_length 4096 --num_epochs 2
    # 7-8B: add --use_lora true --lora_r 16 --learning_rate 1e-4
    # several GPUs: accelerate launch -m reward_models.critic_lm ...

Example::

    from reward_models.critic_lm import CriticConfig, load_generative_critic, main

    summary = main(CriticConfig(data_path="critiques.jsonl", base_model="var/policies/bootstrap",
                                output_dir="var/critic"))
    critic = load_generative_critic("var/critic")
    critic.critique([{"role": "user", "content": transcript + "\\n\\nCritique this trajectory."}])
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import (
    checkpoint_dir,
    last_checkpoint,
    read_manifest,
    trained_model,
    write_manifest,
)
from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, require
from reward_models.common.data import (
    bad_rows,
    message_text,
    row_tools,
    split_by_task,
)
from reward_models.common.judge_config import JudgeConfig, start_judge
from reward_models.common.reporting import Reporter, trainer_callback, without_printer
from reward_models.common.runtime import judge_trainer_args, lora_settings, timed_training
from reward_models.critique_encoding import (
    Prompt,
    Tools,
    completion_text,
    encode_example,
    fit_example,
    fit_prompt,
    prompt_ids,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

KIND = "generative_critic"


@dataclass
class CriticConfig(JudgeConfig):
    output_dir: str = field(default="var/models/critic", metadata={"help": "Where checkpoints and the model go."})

    # Generation
    max_new_tokens: int = field(default=64, metadata={"help": "Longest critique the critic writes, in tokens."})
    num_samples: int = field(
        default=4, metadata={"help": "Held-out prompts critiqued after training, shown with their references."}
    )

    # Memory and speed on large models
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Batches per optimiser step (effective batch = batch_size x this x GPUs)."}
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward pass: less memory, ~30 % slower."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.max_new_tokens >= 1, "max_new_tokens", "must be at least 1")
        require(
            self.max_new_tokens < self.max_length,
            "max_new_tokens",
            f"must be below max_length ({self.max_length}), which holds the prompt and the critique",
        )
        require(self.num_samples >= 0, "num_samples", "must be 0 or more")
        require(self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be at least 1")


@dataclass
class _Examples:
    rows: list[dict[str, Any]]
    input_ids: list[list[int]]
    completion_mask: list[list[int]]
    truncated: int

    def dataset(self):
        from datasets import Dataset

        return Dataset.from_dict({"input_ids": self.input_ids, "completion_mask": self.completion_mask})


def _encode_rows(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], max_length: int) -> _Examples:
    input_ids, masks, truncated = [], [], 0
    for row in rows:
        prompt, critique = encode_example(tokenizer, row["prompt"], row["completion"], row_tools(row))
        fitted_prompt, fitted_critique = fit_example(prompt, critique, max_length)
        truncated += (len(fitted_prompt), len(fitted_critique)) != (len(prompt), len(critique))
        input_ids.append(fitted_prompt + fitted_critique)
        masks.append([0] * len(fitted_prompt) + [1] * len(fitted_critique))
    return _Examples(rows, input_ids, masks, truncated)


def row_problems(rows: Sequence[dict[str, Any]], config: CriticConfig) -> dict[int, str]:
    """The rows the critic cannot learn from, by number, and why: every row needs a prompt (messages or text) and a
    non-empty critique."""
    return bad_rows(rows, _row_problem)


def _row_problem(row: dict[str, Any]) -> str | None:
    for name in ("prompt", "completion"):
        value = row.get(name)
        if not isinstance(value, str | list) or not value:
            return f"{name!r} must be text or a non-empty message list"
    if not completion_text(row["completion"]).strip():
        return "the critique is empty"
    return None


# --- the critic ----------------------------------------------------------------------------------------------------


class GenerativeCritic:
    """Writes critiques with a fine-tuned causal LM, greedily by default.

    >>> critic = load_generative_critic("var/models/critic")  # doctest: +SKIP
    >>> critic.critique([{"role": "user", "content": "System: reach the goal G\\n...\\n\\nCritique this trajectory."}])
    'step 2 is wrong : right moves away from the goal ; down was better'
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int = 64,
        max_length: int = 1024,
        batch_size: int = 8,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_length = max_length
        self.batch_size = batch_size

    def critique(
        self, prompt: Prompt, *, greedy: bool = True, temperature: float = 1.0, max_new_tokens: int | None = None
    ) -> str:
        """The critique of one prompt (a message list or text, as in the `critiques` export)."""
        return self.critiques([prompt], greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens)[0]

    def critiques(
        self,
        prompts: Sequence[Prompt],
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        seed: int = 0,
        tools: Sequence[Tools] = (),
    ) -> list[str]:
        """Critiques of several prompts (with `tools`, one list of tool schemas or None per prompt, for the chat
        template), generated a batch at a time (left-padded)."""
        import torch
        from transformers import GenerationConfig

        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be positive when sampling, got {temperature}")
        new_tokens = max_new_tokens or self.max_new_tokens
        budget = max(self.max_length - new_tokens, 1)
        offered = list(tools) or [None] * len(prompts)
        encoded = [
            fit_prompt(prompt_ids(self.tokenizer, prompt, prompt_tools), budget)
            for prompt, prompt_tools in zip(prompts, offered, strict=True)
        ]
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        generation_config = GenerationConfig(
            max_new_tokens=new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            # 0 and 1.0 switch off the top-k/top-p filters a model's generation_config would otherwise apply.
            top_k=None if greedy else 0,
            top_p=None if greedy else 1.0,
            pad_token_id=pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        device = self.model.device
        was_training = self.model.training
        self.model.eval()
        texts: list[str] = []
        try:
            for start in range(0, len(encoded), self.batch_size):
                batch = encoded[start : start + self.batch_size]
                width = max(len(ids) for ids in batch)
                input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in batch], device=device)
                attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
                    torch.manual_seed(seed + start)
                    output = self.model.generate(
                        input_ids=input_ids, attention_mask=attention, generation_config=generation_config
                    )
                for row in output[:, width:]:
                    ids = row.tolist()
                    if self.tokenizer.eos_token_id in ids:
                        ids = ids[: ids.index(self.tokenizer.eos_token_id)]
                    texts.append(self.tokenizer.decode(ids, skip_special_tokens=True).strip())
        finally:
            self.model.train(was_training)
        return texts


def load_generative_critic(path: str | Path, device: str | None = None) -> GenerativeCritic:
    """The critic a run wrote to `path` (an ordinary causal-LM directory with Tandem's manifest), on `device`
    (default: CUDA when there is one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = read_manifest(path)
    if manifest.get("kind") != KIND:
        raise ValueError(f"{path} holds a {manifest.get('kind')!r}, not a generative critic")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(str(path)).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    config = manifest["config"]
    return GenerativeCritic(
        model,
        tokenizer,
        max_new_tokens=config["max_new_tokens"],
        max_length=config["max_length"],
        batch_size=config["batch_size"],
    )


# --- training ----------------------------------------------------------------------------------------------------


def _sample_rows(rows: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`count` rows spread evenly over `rows` (held-out rows come grouped by task, so this spans tasks)."""
    if count >= len(rows):
        return list(rows)
    return [rows[index * len(rows) // count] for index in range(count)]


def _evaluation_metrics(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    metrics = {
        "eval_loss": after["eval_loss"],
        "perplexity": math.exp(min(after["eval_loss"], 50.0)),
        "base_eval_loss": before["eval_loss"],
        "base_perplexity": math.exp(min(before["eval_loss"], 50.0)),
    }
    if "eval_mean_token_accuracy" in after:
        metrics["mean_token_accuracy"] = after["eval_mean_token_accuracy"]
        metrics["base_mean_token_accuracy"] = before["eval_mean_token_accuracy"]
    return metrics


def main(config: CriticConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Fine-tune the critic on `config.data_path`, evaluate it on held-out tasks and write `config.output_dir`;
    returns the summary (also kept in the manifest). Called again on the same directory, it resumes from the last
    checkpoint, or returns the stored summary when the critic is finished."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    start = start_judge(config, KIND, "critic", row_problems, reporter)
    if start.finished is not None:
        return start.finished
    reporter, precision, local, rows = start.reporter, start.precision, start.local, start.rows
    train_rows, eval_rows = split_by_task(rows, config.eval_fraction, config.seed)
    if not train_rows:
        raise ConfigError("data_path", "leaves no critiques to train on after the held-out split")
    tokenizer = AutoTokenizer.from_pretrained(local.base_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train = _encode_rows(tokenizer, train_rows, config.max_length)
    evaluation = _encode_rows(tokenizer, eval_rows, config.max_length)
    reporter.log(
        f"{len(train_rows)} training critiques, {len(eval_rows)} held out, "
        f"{train.truncated + evaluation.truncated} cut to {config.max_length} tokens; precision {precision}"
    )

    output_dir = Path(config.output_dir)
    resume = last_checkpoint(output_dir)
    args = SFTConfig(
        output_dir=str(checkpoint_dir(output_dir)),
        per_device_eval_batch_size=config.batch_size,
        completion_only_loss=True,
        # Rows are already fitted by fit_example; activation checkpointing follows the config (TRL's default is on).
        **judge_trainer_args(config, precision, config.seed),
    )
    peft_config = lora_settings(config.lora_r) if config.use_lora else None
    trainer = without_printer(
        SFTTrainer(
            model=local.base_model,
            args=args,
            train_dataset=train.dataset(),
            eval_dataset=evaluation.dataset() if eval_rows else None,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[trainer_callback(reporter)],
        )
    )
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    before = trainer.evaluate() if eval_rows else {}
    if resume:
        reporter.log(f"resuming from {resume}")
    reporter.log(f"training {trainable:,} of {total:,} parameters{' (LoRA)' if config.use_lora else ''}")
    seconds, samples_trained = timed_training(trainer, resume, config)

    after = trainer.evaluate() if eval_rows else {}
    metrics = _evaluation_metrics(before, after) if eval_rows else {}
    model = trained_model(trainer.accelerator, trainer.model)
    model = model.merge_and_unload() if config.use_lora else model
    critic = GenerativeCritic(
        model,
        tokenizer,
        max_new_tokens=config.max_new_tokens,
        max_length=config.max_length,
        batch_size=config.batch_size,
    )
    shown = _sample_rows(eval_rows, config.num_samples)
    generated = critic.critiques([row["prompt"] for row in shown], tools=[row_tools(row) for row in shown])
    samples = [
        {
            "prompt": message_text(row["prompt"]),
            "reference": completion_text(row["completion"]).strip(),
            "generated": text,
        }
        for row, text in zip(shown, generated, strict=True)
    ]
    summary = {
        "metrics": metrics,
        "train_samples": len(train_rows),
        "eval_samples": len(eval_rows),
        "truncated_examples": train.truncated + evaluation.truncated,
        "train_seconds": seconds,
        "samples_per_second": samples_trained / seconds if seconds else 0.0,
        "global_step": trainer.state.global_step,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "lora_merged": config.use_lora,
        "output_dir": str(output_dir),
        "resumed_from": resume,
        "samples": samples,
    }
    if trainer.args.should_save:
        # Weights first, manifest last: a directory with a manifest always holds the whole critic, and a crash in
        # between leaves the checkpoints to resume from.
        model.save_pretrained(str(output_dir))
        tokenizer.save_pretrained(str(output_dir))
        write_manifest(output_dir, kind=KIND, config=config, metrics=metrics, summary=summary, precision=precision)
        shutil.rmtree(checkpoint_dir(output_dir), ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    if metrics:
        reporter.log(
            f"held out: loss {metrics['eval_loss']:.3f} (base {metrics['base_eval_loss']:.3f}), "
            f"perplexity {metrics['perplexity']:.2f}"
        )
    return summary


if __name__ == "__main__":
    cli(CriticConfig, main, __doc__)
