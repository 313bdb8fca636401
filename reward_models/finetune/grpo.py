"""GRPO or RLOO for single-turn projects, through TRL's `GRPOTrainer` / `RLOOTrainer`, with a reward model as the
reward function.

A single-turn task is one prompt (the messages before the agent's first turn, with the task's tools) and one
completion (the policy's assistant turn). Each prompt reaches TRL already rendered by the policy's chat template with
its own tools (`text_prompt`; TRL's own rendering would give every prompt one list of tools), TRL samples
``num_generations`` completions per prompt and trains on exactly the tokens it sampled, `RewardModelReward` scores
each (the prompt's messages + the completion as an assistant message, through
``reward_models.reward.model.load_reward_model``: the reward model's own chat template, the same tools, its members'
mean reward), and the policy is updated with group-relative advantages (GRPO) or leave-one-out baselines (RLOO). Only
completion tokens are in TRL's loss; the prompt is context.

Prompts come from ``data_path`` (any exported conversational rows with a ``prompt`` column, e.g. the preference
export the reward model was trained on: each distinct prompt, with its row's ``tools``, once) or, when it is empty,
from the environment: the prompt of ``train_prompts`` training tasks (never a held-out one).

After training, the policy is evaluated on the held-out tasks: multi-turn success (``evaluation.evaluate_policy``) and,
when the environment has an oracle, the single-turn figure itself: the share of held-out first observations whose
greedy (and sampled) decision is an optimal move (``first_step_accuracy``).

Advantages are not scaled by the group's standard deviation by default. With that scaling (TRL's default), the
small differences a reward model gives between near-identical answers are blown up to unit advantages, and the
policy learns to write wrong reasoning the reward model cannot tell from right. Train the reward model with
malformed answers among its rows (`first_step_preference_rows` with ``malformed_per_task``): one that never saw
them lets the policy drop the ``action`` marker.

Defaults suit the tiny gridworld policy on a CPU. For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.grpo --policy_path Qwen/Qwen2.5-0.5B-Instruct --reward_model_path var/models/rm \\
        --output_dir var/policies/grpo --precision bf16 --learning_rate 1e-6 --num_generations 8 \\
        --prompts_per_step 8 --max_steps 500 --kl_beta 0.04    # 7-8B: --use_lora true --learning_rate 1e-5
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reward_models.common.artifacts import checkpoint_dir, last_checkpoint, read_manifest, trained_model
from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, choice, require
from reward_models.common.data import read_rows, row_tools
from reward_models.common.reporting import Reporter, SilentReporter, trainer_callback, without_printer
from reward_models.common.runtime import resolve_precision, trainer_precision_args
from reward_models.conversation import Message
from reward_models.envs.base import message_action, prompt_messages, task_tools
from reward_models.finetune.artifacts import finished_policy, save_trained_policy
from reward_models.finetune.config import PolicyTrainConfig, environment_factory, train_seeds_tasks
from reward_models.finetune.evaluation import evaluate_base, evaluate_policy, success_gain
from reward_models.finetune.policy_model import load_policy_model, playing_policy
from reward_models.finetune.trl_runs import lora_config
from reward_models.policy.turns import render_prompt

KIND = "policy"
ALGORITHMS = ("grpo", "rloo")


@dataclass
class GRPOConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/grpo", metadata={"help": "Where checkpoints and the policy go."})
    reward_model_path: str = field(
        default="",
        metadata={"help": "A reward model directory (reward_models.reward) that scores prompt + completion."},
    )
    algorithm: str = choice("grpo", ALGORITHMS, "grpo (GRPOTrainer) or rloo (RLOOTrainer).")
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate."})
    max_steps: int = field(default=40, metadata={"help": "Optimiser steps."})
    num_generations: int = field(default=8, metadata={"help": "Completions sampled per prompt (the group)."})
    prompts_per_step: int = field(default=8, metadata={"help": "Prompts per optimiser step."})
    batch_size: int = field(
        default=0, metadata={"help": "Ignored: a step holds prompts_per_step x num_generations completions."}
    )
    kl_beta: float = field(default=0.2, metadata={"help": "KL coefficient to the reference (TRL's beta; 0: none)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the training completions."})
    scale_rewards: bool = field(
        default=False,
        metadata={
            "help": "Divide advantages by the group's reward std (TRL's default). Off: a reward model's tiny, noisy "
            "differences stay tiny instead of being blown up to unit scale."
        },
    )
    train_prompts: int = field(
        default=1024, metadata={"help": "Training tasks whose first observation is a prompt (when no data_path)."}
    )
    save_steps: int = field(default=20, metadata={"help": "Checkpoint every this many steps (for resume)."})
    logging_steps: int = field(default=1, metadata={"help": "Record metrics every this many steps."})

    def __post_init__(self) -> None:
        if self.batch_size == 0:
            self.batch_size = self.prompts_per_step * self.num_generations
        super().__post_init__()
        require(bool(self.reward_model_path), "reward_model_path", "is required")
        require(self.num_generations >= 2, "num_generations", "must be at least 2 (advantages compare a group)")
        require(self.prompts_per_step >= 1, "prompts_per_step", "must be at least 1")
        require(
            self.batch_size == self.prompts_per_step * self.num_generations,
            "batch_size",
            "must be prompts_per_step x num_generations (or 0)",
        )
        require(self.kl_beta >= 0, "kl_beta", "must be 0 or positive")
        require(self.temperature > 0, "temperature", "must be positive")
        require(self.train_prompts >= 1, "train_prompts", "must be at least 1")


class RewardModelReward:
    """A TRL reward function: the reward model's score of each prompt (its messages and tools, the dataset's
    ``conversation`` and ``tools`` columns, as JSON text) followed by the sampled completion as an assistant
    message."""

    def __init__(self, path: str | Path, device: str | None = None) -> None:
        from reward_models.reward.model import load_reward_model

        self.model = load_reward_model(path, device)
        self.__name__ = "reward_model"

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[str],
        *,
        conversation: Sequence[str],
        tools: Sequence[str],
        **_,
    ) -> list[float]:
        scores, _ = self.model.score(
            [json.loads(prompt) for prompt in conversation],
            [[{"role": "assistant", "content": completion}] for completion in completions],
            [json.loads(offered) or None for offered in tools],
        )
        return scores


# --- prompts -----------------------------------------------------------------------------------------------------

Prompt = tuple[list[Message], list[dict[str, Any]] | None]  # the messages before the first turn, and the tools


def environment_prompts(config: PolicyTrainConfig, tasks: Sequence[dict[str, Any]]) -> list[Prompt]:
    """What the policy sees before its first turn on each task: the environment's prompt and the task's tools."""
    env = environment_factory(config)()
    return [(prompt_messages(env, task, env.reset(task)), task_tools(task) or None) for task in tasks]


def data_prompts(rows: Sequence[dict[str, Any]]) -> list[Prompt]:
    """Each distinct ``prompt`` of exported conversational rows, with the row's tools, in first-seen order."""
    seen, prompts = set(), []
    for number, row in enumerate(rows, start=1):
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise ConfigError("data_path", f"row {number}: 'prompt' must be a non-empty list of messages")
        tools = row_tools(row)
        key = json.dumps([prompt, tools], sort_keys=True)
        if key not in seen:
            seen.add(key)
            prompts.append((prompt, tools))
    return prompts


def text_prompt(tokenizer: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None) -> str:
    """The prompt as TRL gets it: rendered by the policy's chat template with its own tools, ending where the
    answer starts. TRL tokenizes a text prompt with the tokenizer's special tokens, so a <bos> the template writes
    is left to the tokenizer where it adds one itself."""
    text = render_prompt(tokenizer, messages, tools)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        return text[len(bos) :]
    return text


def prompt_dataset(tokenizer: Any, prompts: Sequence[Prompt]) -> Any:
    """The `datasets.Dataset` TRL samples from: ``prompt`` (`text_prompt`), and the messages and tools the reward
    function reads, as JSON text."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "prompt": [text_prompt(tokenizer, messages, tools) for messages, tools in prompts],
            "conversation": [json.dumps(messages, ensure_ascii=False) for messages, _ in prompts],
            "tools": [json.dumps(tools or [], ensure_ascii=False) for _, tools in prompts],
        }
    )


def first_step_accuracy(
    model: Any, tokenizer: Any, settings: dict[str, Any], config: PolicyTrainConfig, *, seed: int = 0
) -> dict[str, float]:
    """On the held-out tasks: the share whose first decision is an optimal move by the environment's oracle, greedy
    and sampled; {} when the environment has no oracle or `eval_tasks` is 0."""
    if not config.eval_tasks:
        return {}
    env = environment_factory(config)()
    tasks = [env.make_task(task_seed) for task_seed in list(env.eval_seeds())[: config.eval_tasks]]
    oracles = [env.oracle(task) for task in tasks]
    if any(oracle is None for oracle in oracles):
        return {}
    prompts = environment_prompts(config, tasks)
    padding_side = tokenizer.padding_side
    policy = playing_policy(model, tokenizer, settings, config)
    figures = {}
    try:
        for mode, greedy in (("greedy", True), ("sampled", False)):
            decisions = policy.act(
                [messages for messages, _ in prompts],
                tools=[tools for _, tools in prompts],
                greedy=greedy,
                temperature=config.eval_temperature,
                seed=seed,
            )
            right = [
                message_action(env, decision.message) in oracle.best_actions([])
                for decision, oracle in zip(decisions, oracles, strict=True)
            ]
            figures[f"{mode}_first_step_accuracy"] = sum(right) / len(right)
    finally:
        tokenizer.padding_side = padding_side
    return figures


def first_step_preference_rows(
    n_tasks: int,
    *,
    pairs_per_task: int = 2,
    malformed_per_task: int = 0,
    seed: int = 0,
    env_config: dict[str, Any] | None = None,
    epsilon: float = 0.0,
) -> list[dict[str, Any]]:
    """Oracle-labelled single-step comparisons in the `preference` export's conversational layout, for tests and
    benches of single-turn training: the prompt is a training task's instruction and first observation, chosen an
    optimal move and rejected a non-optimal one, each with the demonstrator's reasoning (the true offset to the
    goal). `malformed_per_task` more pairs reject an answer the environment cannot parse into a move (the reasoning
    alone, or the move without the ``action`` marker), as an annotator rejects an unusable answer: without them a
    reward model never sees such text, and GRPO learned to drop the marker (measured; see the report). With
    probability `epsilon` a pair is labelled the wrong way round, as the other simulated annotators err."""
    from reward_models.envs.base import training_seeds
    from reward_models.envs.gridworld import ACTIONS, GridWorld
    from reward_models.policy.bootstrap import goal_reasoning

    env = GridWorld(**(env_config or {}))
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for task_seed in training_seeds(env, n_tasks):
        task = env.make_task(task_seed)
        observation = env.reset(task)
        best = env.oracle(task).best_actions([])
        worse = [action for action in ACTIONS if action not in best]
        reasoning = goal_reasoning(observation)
        prompt = prompt_messages(env, task, observation)
        pairs = []
        for _ in range(pairs_per_task):
            good, bad = rng.choice(best), rng.choice(worse)
            pairs.append((env.message_for_action(good, reasoning), env.message_for_action(bad, reasoning)))
        for _ in range(malformed_per_task):
            good = rng.choice(best)
            malformed = rng.choice([reasoning, f"{reasoning} ; {rng.choice(ACTIONS)}"])
            pairs.append((env.message_for_action(good, reasoning), {"role": "assistant", "content": malformed}))
        if epsilon > 0:
            pairs = [(bad, good) if rng.random() < epsilon else (good, bad) for good, bad in pairs]
        for chosen, rejected in pairs:
            rows.append(
                {
                    "prompt": prompt,
                    "chosen": [chosen],
                    "rejected": [rejected],
                    "margin": 1.0,
                    "task_id": task_seed,
                    "tie": False,
                    "pair_type": "one_succeeded",
                    "tools": task_tools(task),
                }
            )
    return rows


# --- training ----------------------------------------------------------------------------------------------------


def main(config: GRPOConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train the policy with TRL's GRPO or RLOO against the reward model, evaluate it before and after, and write
    the policy directory to `config.output_dir`; returns the summary (also kept in the manifest)."""
    import torch
    from transformers import TrainerState

    reporter = reporter or SilentReporter()
    finished = finished_policy(config, KIND, reporter)
    if finished is not None:
        return finished
    precision = resolve_precision(config.precision)
    torch.manual_seed(config.seed)
    policy = load_policy_model(config.policy_path)
    tokenizer, settings = policy.tokenizer, policy.settings
    reward = RewardModelReward(config.reward_model_path)
    if config.data_path:
        prompts = data_prompts(read_rows(config.data_path))
    else:
        prompts = environment_prompts(config, train_seeds_tasks(config, config.train_prompts))
    # The human labels behind this run are the comparisons the reward model learned from.
    labels_used = int((read_manifest(config.reward_model_path).get("summary") or {}).get("train_samples") or 0)
    if not prompts:
        raise ConfigError("data_path", "holds no prompts")

    resume = last_checkpoint(config.output_dir)
    state_file = Path(config.output_dir) / "tandem_base_metrics.json"
    if state_file.is_file():
        base = json.loads(state_file.read_text())
    else:
        reporter.log(f"evaluating the starting policy on {config.eval_tasks} held-out tasks")
        base = {
            **evaluate_base(policy.model, tokenizer, settings, config, reporter),
            **first_step_accuracy(policy.model, tokenizer, settings, config, seed=config.seed),
        }
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(base) + "\n")

    common_args: dict[str, Any] = {
        "output_dir": str(checkpoint_dir(config.output_dir)),
        "seed": config.seed,
        "learning_rate": config.learning_rate,
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.batch_size,
        "num_generations": config.num_generations,
        "max_completion_length": settings["max_new_tokens"],
        "temperature": config.temperature,
        "beta": config.kl_beta,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": 2,
        "logging_steps": config.logging_steps,
        "report_to": "none",
        "disable_tqdm": True,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": 2,
        **trainer_precision_args(precision),
    }
    if config.algorithm == "grpo":
        from trl import GRPOConfig as TRLConfig
        from trl import GRPOTrainer as Trainer

        common_args["scale_rewards"] = "group" if config.scale_rewards else "none"
    else:
        from trl import RLOOConfig as TRLConfig
        from trl import RLOOTrainer as Trainer

        common_args["normalize_advantages"] = config.scale_rewards
    peft_config = lora_config(config)
    trainer = without_printer(
        Trainer(
            model=policy.model,
            reward_funcs=reward,
            args=TRLConfig(**common_args),
            train_dataset=prompt_dataset(tokenizer, prompts),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[trainer_callback(reporter)],
        )
    )
    if resume:
        reporter.log(f"resuming from {resume}")
    start_step = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json")).global_step if resume else 0
    reporter.log(f"{config.algorithm}: {len(prompts)} prompts, {config.num_generations} completions each")
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - started

    model = trained_model(trainer.accelerator, trainer.model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    reporter.log("evaluating the trained policy")
    final = {
        **evaluate_policy(model, tokenizer, settings, config, seed=config.seed, per_task=True, reporter=reporter),
        **first_step_accuracy(model, tokenizer, settings, config, seed=config.seed),
    }
    metrics: dict[str, Any] = {"base": base, "final": final}
    metrics.update(success_gain(metrics))
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    if logged:
        metrics["first_reward"] = logged[0]["reward"]
        metrics["last_reward"] = logged[-1]["reward"]
    summary = {
        "algorithm": config.algorithm,
        "metrics": metrics,
        "reward_curve": [entry["reward"] for entry in logged],
        "loss_curve": [entry.get("loss") for entry in logged],
        "labels_used": labels_used,
        "prompts": len(prompts),
        "steps": trainer.state.global_step,
        "steps_this_run": trainer.state.global_step - start_step,
        "train_seconds": seconds,
        "output_dir": str(config.output_dir),
        "resumed_from": resume,
    }
    if trainer.args.should_save:
        save_trained_policy(model, tokenizer, settings, config, kind=KIND, metrics=metrics, summary=summary)
    return summary


if __name__ == "__main__":
    cli(GRPOConfig, main, __doc__)
