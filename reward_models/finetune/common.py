"""What every policy trainer shares: the config, loading a policy to train, per-turn encodings with the observation
mask, log-probabilities, held-out evaluation, accelerate checkpoints, and the saved policy directory.

The observation mask. A trajectory is a conversation (`reward_models.conversation`), and the policy only ever writes
the assistant turns. Every trainer scores a trajectory turn by turn: turn ``i`` is encoded as the prompt the policy
saw before it (the conversation so far through its history window, rendered by its chat template with the task's
tools: `turns.encode_conversation`) and the assistant message it wrote, exactly as ``LocalCausalLMPolicy``
generated it (its token ids, where a rollout kept them). ``pad_turns`` marks the completion tokens, and
``token_logprobs`` keeps the log-probabilities of those tokens only, so instruction, observation, tool-result and
padding tokens are context, never targets: no loss is taken on them and no gradient reaches their logits.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import ARTIFACT_MANIFEST, checkpoint_dir, finished_summary, write_manifest
from reward_models.common.cli import first_process
from reward_models.common.config import ConfigError, require
from reward_models.common.judge_config import PRECISIONS, model_directory
from reward_models.common.reporting import Reporter
from reward_models.common.runtime import fresh_accelerator, resolve_precision
from reward_models.conversation import Conversation, Message, build_conversation, split_conversation
from reward_models.envs.base import Environment, load_environment, training_seeds
from reward_models.policy.model import read_policy_settings, save_policy
from reward_models.policy.turns import TurnEncoding, encode_conversation

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.policy.base import Policy
    from reward_models.rollout import Episode

GRIDWORLD = "reward_models.envs.gridworld.GridWorld"
LOOP_STATE_FILE = "loop_state.json"


@dataclass
class PolicyTrainConfig:
    """Settings every policy trainer shares. Subclasses redefine a field to change its default."""

    policy_path: str = field(default="", metadata={"help": "The policy directory to start from (Hugging Face)."})
    reference_path: str = field(
        default="", metadata={"help": "The reference policy for the KL term or DPO; empty: the starting policy."}
    )
    data_path: str = field(default="", metadata={"help": "An exported snapshot (JSONL or Parquet), for offline data."})
    output_dir: str = field(default="var/policies/trained", metadata={"help": "Where checkpoints and the policy go."})
    snapshot_hash: str = field(default="", metadata={"help": "The snapshot's content hash, kept in the manifest."})
    seed: int = field(default=0, metadata={"help": "Seeds sampling, batch order and evaluation."})
    learning_rate: float = field(default=1e-5, metadata={"help": "Peak learning rate."})
    max_steps: int = field(default=100, metadata={"help": "Optimiser steps (or iterations, for online trainers)."})
    batch_size: int = field(default=16, metadata={"help": "Examples per optimiser step."})
    save_steps: int = field(default=25, metadata={"help": "Checkpoint every this many steps (for resume)."})
    logging_steps: int = field(default=5, metadata={"help": "Record metrics every this many steps."})
    max_seconds: float = field(default=0.0, metadata={"help": "Stop training after this many seconds (0: no limit)."})
    precision: str = field(
        default="auto",
        metadata={"choices": PRECISIONS, "help": f"One of {', '.join(PRECISIONS)}; auto: bf16 on CUDA."},
    )
    use_lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft), merged into the result."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    environment: str = field(default=GRIDWORLD, metadata={"help": "The environment class, as a dotted path."})
    environment_config: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Keyword arguments for the environment, as a JSON object."}
    )
    eval_tasks: int = field(default=200, metadata={"help": "Held-out tasks for before/after success (0: skip)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Temperature of the sampled evaluation."})
    eval_samples: int = field(
        default=1, metadata={"help": "Sampled episodes per held-out task (more: a smaller standard error)."}
    )
    generation_batch_size: int = field(
        default=256,
        metadata={
            "help": "Episodes whose turns are generated together, in rollouts and evaluation; lower it when "
            "generation runs out of memory (the KV cache grows with it)."
        },
    )
    eval_base: bool = field(
        default=True,
        metadata={"help": "Also evaluate the starting policy (off when its figures are known: a loop's last round)."},
    )

    def __post_init__(self) -> None:
        require(bool(self.policy_path), "policy_path", "is required")
        require(bool(self.output_dir), "output_dir", "is required")
        require(0 < self.learning_rate < 1, "learning_rate", "must be between 0 and 1")
        for name in ("max_steps", "batch_size", "save_steps", "logging_steps", "lora_r", "generation_batch_size"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.max_seconds >= 0, "max_seconds", "must be 0 (no limit) or positive")
        require(self.precision in PRECISIONS, "precision", f"must be one of {', '.join(PRECISIONS)}")
        require(self.eval_tasks >= 0, "eval_tasks", "must be 0 (skip) or positive")
        require(self.eval_temperature > 0, "eval_temperature", "must be positive")
        require(self.eval_samples > 0, "eval_samples", "must be positive")
        try:
            environment_factory(self)()
        except ValueError as exc:
            raise ConfigError("environment", str(exc)) from None

    @property
    def reference(self) -> str:
        return self.reference_path or self.policy_path


def out_of_time(config: PolicyTrainConfig, started: float) -> bool:
    """Whether `config.max_seconds` have passed since `started` (a `time.monotonic()` reading). Under several
    processes the first one's clock decides for all: one process stopping alone would leave the others waiting for
    it in their next gradient exchange."""
    if not config.max_seconds:
        return False
    over = time.monotonic() - started > config.max_seconds
    from accelerate import PartialState

    if PartialState().num_processes == 1:
        return over
    from accelerate.utils import broadcast_object_list

    return bool(broadcast_object_list([over], from_process=0)[0])


# --- the policy and its environment ------------------------------------------------------------------------------


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
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=lora_r, lora_alpha=2 * lora_r))
    if not dropout:
        disable_dropout(model)
    if not trainable:
        model.eval().requires_grad_(False)
    return PolicyModel(model, tokenizer, read_policy_settings(path))


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


def environment_factory(config: PolicyTrainConfig) -> Callable[[], Environment]:
    """A fresh environment per call (environments are stateful), as `reward_models.rollout` wants."""
    return partial(load_environment, config.environment, config.environment_config)


def process_share(accelerator: Accelerator, batch: list[int]) -> list[int]:
    """This process's share of `batch` under several processes (the gradients are averaged across them); all of it
    with one process, or when the batch is smaller than the number of processes."""
    return batch[accelerator.process_index :: accelerator.num_processes] or batch


def shared_rollout(
    accelerator: Accelerator,
    env_factory: Callable[[], Environment],
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    *,
    seed: int,
    **options: Any,
) -> list[Episode]:
    """`rollout.rollout` split across the processes: each rolls out its share of the tasks (every sample of a task
    in one process), with its own sampling seeds, and every process gets all the episodes, in the order of the
    processes, so the update that follows is the same everywhere. With one process, exactly `rollout`."""
    from reward_models.rollout import rollout

    if accelerator.num_processes == 1:
        return rollout(env_factory, tasks, policy, seed=seed, **options)
    from accelerate.utils import gather_object

    rank = accelerator.process_index
    mine = list(tasks[rank :: accelerator.num_processes])
    return gather_object(rollout(env_factory, mine, policy, seed=seed + rank * 2**31, **options))


def train_seeds_tasks(config: PolicyTrainConfig, count: int, start: int = 0) -> list[dict[str, Any]]:
    """`count` training tasks from seed `start` up, never one of the environment's held-out evaluation tasks."""
    env = environment_factory(config)()
    return [env.make_task(seed) for seed in training_seeds(env, count, start)]


def evaluate_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    settings: dict[str, Any],
    config: PolicyTrainConfig,
    *,
    seed: int = 0,
    per_task: bool = False,
    reporter: Reporter | None = None,
    whose: str = "the trained policy",
) -> dict[str, Any]:
    """Greedy and sampled success on the first `config.eval_tasks` held-out tasks (`config.eval_samples` sampled
    episodes of each), each with its standard error over tasks (`rollout.evaluate_success`); {} when `eval_tasks`
    is 0. With `per_task`, also each task's success (`greedy_per_task`, `sampled_per_task`), for paired comparisons.
    Pass the unwrapped model (`accelerator.unwrap_model`). With a `reporter`, the finished episodes are its progress
    after every turn, in the phase "evaluating <whose>: greedy" (then sampled), so a cancel stops an evaluation too."""
    from reward_models.policy.local import LocalCausalLMPolicy
    from reward_models.rollout import evaluate_success

    if not config.eval_tasks:
        return {}
    factory = environment_factory(config)
    seeds = list(factory().eval_seeds())[: config.eval_tasks]
    padding_side = tokenizer.padding_side  # generation pads on the left; trainers may pad on the right
    policy = LocalCausalLMPolicy.from_model(
        model,
        tokenizer,
        history_window=settings["history_window"],
        max_new_tokens=settings["max_new_tokens"],
        batch_size=config.generation_batch_size,
    )
    try:
        greedy = evaluate_success(
            policy,
            factory,
            seeds,
            greedy=True,
            seed=seed,
            progress=_phase_progress(reporter, f"evaluating {whose}: greedy"),
        )
        sampled = evaluate_success(
            policy,
            factory,
            seeds,
            greedy=False,
            samples=config.eval_samples,
            temperature=config.eval_temperature,
            seed=seed,
            progress=_phase_progress(reporter, f"evaluating {whose}: sampled"),
        )
    finally:
        tokenizer.padding_side = padding_side
    figures: dict[str, Any] = {
        "greedy_success": greedy["success_rate"],
        "greedy_stderr": greedy["stderr"],
        "sampled_success": sampled["success_rate"],
        "sampled_stderr": sampled["stderr"],
        "mean_length": sampled["mean_length"],
        "tasks": len(seeds),
    }
    if per_task:
        figures["greedy_per_task"], figures["sampled_per_task"] = greedy["task_rates"], sampled["task_rates"]
    return figures


def _phase_progress(reporter: Reporter | None, phase: str) -> Callable[[int, int], None] | None:
    """A `rollout` progress callback that reports to `reporter` in `phase` (None without a reporter)."""
    if reporter is None:
        return None
    return lambda done, total: reporter.progress(done, total, phase)


def rollout_progress(reporter: Reporter, iteration: int, iterations: int) -> Callable[[int, int], None]:
    """The progress callback of an online trainer's rollouts in iteration `iteration` (from 1). After every turn it
    reports training's progress as it stands (the iterations finished before this one), so the bar keeps counting
    iterations while the reporter still sees a call each turn: a cancel stops the rollouts within a turn."""
    return lambda done, total: reporter.progress(iteration - 1, iterations)


def finished_policy(config: PolicyTrainConfig, kind: str, reporter: Reporter) -> dict[str, Any] | None:
    """The stored summary when `config.output_dir` already holds a finished policy of `kind` (and says so through
    `reporter`), else None: a trainer returns it instead of training again."""
    finished = finished_summary(config, kind)
    if finished is not None:
        reporter.log(f"{config.output_dir} already holds this policy; not training again")
    return finished


def evaluate_base(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    settings: dict[str, Any],
    config: PolicyTrainConfig,
    reporter: Reporter | None = None,
) -> dict[str, Any]:
    """`evaluate_policy` for the starting policy, or {} when `config.eval_base` is off."""
    if not config.eval_base:
        return {}
    return evaluate_policy(
        model, tokenizer, settings, config, seed=config.seed, per_task=True, reporter=reporter, whose="the base policy"
    )


# --- turns, padding and log-probabilities ------------------------------------------------------------------------


def row_conversation(messages: Sequence[Message]) -> Conversation:
    """An exported message list as a trajectory conversation: the messages before the first assistant message are
    its prompt, and each assistant message starts a step (`conversation.split_conversation`)."""
    return build_conversation(*split_conversation(messages))


def is_messages(value: Any) -> bool:
    """Whether `value` is a list of chat messages (dicts with a role), as a conversational export writes them."""
    return isinstance(value, list) and all(isinstance(message, dict) and "role" in message for message in value)


def prompt_steps(prompt: Sequence[Message]) -> int:
    """How many of a conversation's steps a row's prompt already holds (its assistant messages)."""
    return sum(message.get("role") == "assistant" for message in prompt)


def episode_encodings(
    tokenizer: PreTrainedTokenizerBase, episode: Episode, history_window: int | None, *, max_prompt_tokens: int = 0
) -> list[TurnEncoding]:
    """Every turn of a rollout's episode as the policy saw it (`turns.encode_conversation`, with the episode's
    tools) and wrote it: each completion is the token ids generation produced where the step kept them (decoding
    and re-encoding a sampled completion need not give the same tokens back: a special token the text drops, for
    one). `max_prompt_tokens` cuts the prompts as the policy's generation cut them (`turns.cut_prompt`)."""
    encodings = encode_conversation(
        tokenizer,
        episode.conversation(),
        episode.tools or None,
        history_window,
        max_prompt_tokens=max_prompt_tokens,
    )
    return [
        TurnEncoding(encoding.prompt_ids, list(step.token_ids)) if step.token_ids else encoding
        for encoding, step in zip(encodings, episode.steps, strict=True)
    ]


@dataclass
class TurnBatch:
    input_ids: torch.Tensor  # (B, T), right-padded
    attention_mask: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T): 1 on the policy's own tokens, 0 on prompt and padding

    def to(self, device: Any) -> TurnBatch:
        return TurnBatch(self.input_ids.to(device), self.attention_mask.to(device), self.completion_mask.to(device))


def pad_turns(encodings: Sequence[TurnEncoding], pad_token_id: int, max_length: int | None = None) -> TurnBatch:
    """One batch of turns, right-padded. With `max_length`, a prompt too long is cut from the left (the oldest
    history goes first) and a completion longer than `max_length` is cut at the end."""
    import torch

    if not encodings:
        raise ValueError("pad_turns needs at least one turn")
    rows, masks = [], []
    for encoding in encodings:
        prompt, completion = list(encoding.prompt_ids), list(encoding.completion_ids)
        if max_length is not None and len(prompt) + len(completion) > max_length:
            completion = completion[:max_length]
            keep = max_length - len(completion)
            prompt = prompt[len(prompt) - keep :] if keep else []
        rows.append(prompt + completion)
        masks.append([0] * len(prompt) + [1] * len(completion))
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    completion_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, (row, mask) in enumerate(zip(rows, masks, strict=True)):
        input_ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[index, : len(row)] = 1
        completion_mask[index, : len(row)] = torch.tensor(mask, dtype=torch.long)
    return TurnBatch(input_ids, attention_mask, completion_mask)


def token_logprobs(
    model: PreTrainedModel, batch: TurnBatch, logits: torch.Tensor | None = None, *, temperature: float = 1.0
) -> torch.Tensor:
    """(B, T): log p(token t | tokens before it) at completion tokens, 0 elsewhere (and at position 0). Pass
    `logits` when the caller already ran the model (e.g. to take the entropy too). With `temperature`, the model's
    own logits are divided by it first, as sampling at that temperature did: an on-policy update scores the tokens
    under the distribution that drew them."""
    import torch

    if logits is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        if temperature != 1.0:
            logits = logits / temperature
    elif temperature != 1.0:
        raise ValueError("temperature: given logits are used as they are; scale them before passing them")
    shifted = logits[:, :-1].float()
    targets = batch.input_ids[:, 1:]
    chosen = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - shifted.logsumexp(dim=-1)
    mask = batch.completion_mask[:, 1:].to(chosen.dtype)
    # Multiplying by the mask, not indexing, keeps the shape; masked positions contribute 0 and get no gradient.
    return torch.nn.functional.pad(chosen * mask, (1, 0))


def completion_logprobs(model: PreTrainedModel, batch: TurnBatch) -> torch.Tensor:
    """(B,): the summed log-probability of each row's completion under `model`."""
    return token_logprobs(model, batch).sum(dim=-1)


# --- accelerate loops: precision, checkpoints, resume --------------------------------------------------------------


def make_accelerator(config: PolicyTrainConfig) -> Accelerator:
    """An `Accelerator` with the config's precision (fp32 on CPU) on the one device, or on every process of an
    `accelerate launch`."""
    return fresh_accelerator(resolve_precision(config.precision))


def loop_checkpoints(config: PolicyTrainConfig) -> list[Path]:
    """The run's complete loop checkpoints (`checkpoints/step-N`), oldest first."""
    folder = checkpoint_dir(config.output_dir)
    if not folder.is_dir():
        return []
    complete = [path for path in folder.glob("step-*") if (path / LOOP_STATE_FILE).is_file()]
    return sorted(complete, key=lambda path: int(path.name.removeprefix("step-")))


def save_loop_checkpoint(
    accelerator: Accelerator, config: PolicyTrainConfig, step: int, state: dict[str, Any]
) -> Path:
    """Save everything `accelerator` prepared (models, optimisers, schedulers, RNG states) and `state` (JSON: the
    loop's own counters and history) as `checkpoints/step-<step>`, written aside and renamed into place so a crash
    mid-save leaves the previous checkpoint intact; the last two are kept."""
    folder = checkpoint_dir(config.output_dir) / f"step-{step}"
    staging = folder.with_name(folder.name + ".part")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    # Every process writes its own RNG state into `staging`, and `save_state` ends without a barrier: renaming before
    # the others finish makes their writes fail ("parent directory ... does not exist").
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / LOOP_STATE_FILE).write_text(json.dumps({"step": step, **state}, default=float) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        for old in loop_checkpoints(config)[:-2]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return folder


def resume_loop_checkpoint(
    accelerator: Accelerator, config: PolicyTrainConfig
) -> tuple[int, dict[str, Any], Path | None]:
    """Load the newest loop checkpoint into what `accelerator` prepared (call after `prepare`): returns its step,
    its `state` and its path, or `(0, {}, None)` when the run has none."""
    checkpoints = loop_checkpoints(config)
    if not checkpoints:
        return 0, {}, None
    latest = checkpoints[-1]
    accelerator.load_state(str(latest))
    state = json.loads((latest / LOOP_STATE_FILE).read_text())
    return int(state.pop("step")), state, latest


# --- the result ----------------------------------------------------------------------------------------------------


def save_trained_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    settings: dict[str, Any],
    config: PolicyTrainConfig,
    *,
    kind: str,
    metrics: dict[str, Any],
    summary: dict[str, Any],
) -> Path:
    """Write the trained policy into `config.output_dir`: an ordinary Hugging Face directory (LoRA adapters merged)
    with `tandem_policy.json` (the starting policy's history window and token budget) and the manifest, which is
    written last, so its presence means the directory is complete. Under `torchrun` or `accelerate launch` only the
    first process writes (every process holds the same weights); the others return the manifest's path at once."""
    path = Path(config.output_dir) / ARTIFACT_MANIFEST
    if not first_process():
        return path
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    save_policy(
        model,
        tokenizer,
        config.output_dir,
        history_window=settings["history_window"],
        max_new_tokens=settings["max_new_tokens"],
    )
    return write_manifest(
        config.output_dir, kind=kind, config=config, metrics=metrics, summary=summary, base_model=config.policy_path
    )


def success_gain(metrics: dict[str, Any]) -> dict[str, float]:
    """`final` minus `base` success, greedy and sampled, when both evaluations ran; with each task's success in both
    (the same held-out tasks), also the gain's paired standard error (`greedy_gain_stderr`, ...)."""
    from reward_models.rollout import paired_difference

    base, final = metrics.get("base") or {}, metrics.get("final") or {}
    gains: dict[str, float] = {}
    for mode in ("greedy", "sampled"):
        key = f"{mode}_success"
        if key not in base or key not in final or not math.isfinite(final[key]):
            continue
        gains[f"{mode}_gain"] = final[key] - base[key]
        before, after = base.get(f"{mode}_per_task"), final.get(f"{mode}_per_task")
        if before and after and len(before) == len(after):
            gains[f"{mode}_gain_stderr"] = paired_difference(before, after)[1]
    return gains


def trainer_time_limit(config: PolicyTrainConfig, started: float):
    """A `transformers.TrainerCallback` that stops a TRL or HF `Trainer` after the optimiser step in which
    `config.max_seconds` ran out (`out_of_time`), so `max_seconds` bounds TRL-based trainers as it bounds loops."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if out_of_time(config, started):
                control.should_training_stop = True

    return TimeLimit()


def train_with_resume(trainer: Any, config: PolicyTrainConfig, reporter: Any, extra: Sequence[str] = ()) -> tuple:
    """Run a TRL or transformers `trainer` to its end, resuming from the run's last checkpoint. Returns the loss
    summary (`steps`, `first_loss`, `last_loss`, and the last logged value of each of `extra`, e.g. ``"kl"``) and the
    checkpoint it resumed from (None for a fresh start)."""
    from reward_models.common.artifacts import last_checkpoint

    resume = last_checkpoint(config.output_dir)
    if resume:
        reporter.log(f"resuming from {resume}")
    trainer.train(resume_from_checkpoint=resume)
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    training: dict[str, Any] = {"steps": trainer.state.global_step}
    if history:
        training["first_loss"], training["last_loss"] = history[0]["loss"], history[-1]["loss"]
        for name in extra:
            if name in history[-1]:
                training[name.replace("/", "_")] = history[-1][name]
    return training, resume


def final_metrics(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    settings: dict[str, Any],
    config: PolicyTrainConfig,
    base: dict[str, float],
    training: dict[str, Any],
    reporter: Reporter | None = None,
) -> dict[str, Any]:
    """The summary's `metrics`: the starting policy's held-out success (`base`), the trained one's (`final`), the
    gains, and the trainer's own `training` figures."""
    metrics: dict[str, Any] = {"base": base, "training": training}
    metrics["final"] = evaluate_policy(
        model, tokenizer, settings, config, seed=config.seed, per_task=True, reporter=reporter
    )
    metrics.update(success_gain(metrics))
    return metrics


def trl_arguments(config: PolicyTrainConfig, steps: int) -> dict[str, Any]:
    """The settings every TRL trainer of a policy run shares (pass them to its config class with its own): `steps`
    optimiser steps with linear decay after a 10 % warm-up, checkpoints in the run's checkpoint folder (the last two
    kept), the run's precision, no reports, no progress bars (the reporter reports), and no prompt cutting (prompts
    are cut from the left before they reach TRL)."""
    from reward_models.common.runtime import resolve_precision, trainer_precision_args

    return {
        "output_dir": str(checkpoint_dir(config.output_dir)),
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": "linear",
        "warmup_steps": math.ceil(0.1 * steps),
        "max_steps": steps,
        "per_device_train_batch_size": config.batch_size,
        "max_length": None,
        "activation_checkpointing": getattr(config, "gradient_checkpointing", False),
        "save_steps": config.save_steps,
        "save_total_limit": 2,
        "logging_steps": config.logging_steps,
        "report_to": "none",
        "disable_tqdm": True,
        "seed": config.seed,
        "dataloader_num_workers": 0,
        **trainer_precision_args(resolve_precision(config.precision)),
    }


def lora_config(config: PolicyTrainConfig) -> Any:
    """peft's LoRA settings when the run asks for adapters (rank `lora_r`, alpha twice that), else None."""
    if not config.use_lora:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", r=config.lora_r, lora_alpha=2 * config.lora_r)
