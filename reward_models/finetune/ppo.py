"""Tandem's own multi-turn PPO: rollouts in the environment, rewards from the reward model (trajectory level), the
PRM (dense, per step) and a KL penalty to the reference policy, per-turn advantages by GAE from a value critic that
PPO keeps training, and the clipped policy-gradient loss on the policy's own tokens only.

One iteration:

1. Roll out ``rollouts_per_step`` episodes of fresh training tasks (never the held-out ones), sampled at
   ``temperature``, in lockstep (`reward_models.rollout`).
2. Encode every turn as the policy saw and wrote it (`turn_batches.episode_encodings`: the prompt its chat template
   rendered with the task's tools, and the generated token ids), and take each completion token's log-probability under
   the policy (old) and the reference.
3. Per-turn rewards (`ppo_rewards`): the reward model's normalised score on the last turn and ``prm_weight * (P(good)
   - 0.5)`` on each turn, only where negative (``prm_shaping``: a charge for bad steps, no pay for length), or, with
   ``reward_source="oracle"``, the environment's own rewards (the upper bound); minus ``kl_beta`` times the turn's
   KL to the reference. With ``kl_target`` the coefficient adapts (Ziegler et al. 2019).
4. Values V(s_t) before each turn from the critic, GAE over the episode's turns (``gamma``, ``lam``), advantages
   whitened over the batch. An episode the turn cap (``max_turns``) cut short is not finished: its last turn
   bootstraps from the critic's value of the state after it (`ppo_rewards.episode_values`).
5. ``ppo_epochs`` passes over the turns in shuffled minibatches of ``batch_size`` turns: the clipped surrogate with a
   per-token ratio (each token of a turn carries the turn's advantage; the loss is the mean over completion tokens),
   and over the critic's step windows the clipped value loss. Observation, tool-result, instruction and padding tokens
   are prompt tokens: `turn_batches.token_logprobs` gives them log-probability 0 and no gradient. A minibatch runs as
   groups of turns of like length (`turn_batches.like_lengths`), their gradients accumulating before its one
   optimiser step: the step the whole minibatch gives, without computing the padding a first turn would need beside
   an episode's last.

The critic: the `reward_models.value` critic in ``value_critic_path``, or, without one, a copy of the starting policy's
weights with a fresh one-output head (a separate model: policy and critic share no parameters, so the value loss never
moves the policy). It is saved beside the policy as ``value_critic/``, a directory `load_value_critic` reads.

Keeping the best policy. Policy gradient on a learned reward model can climb and then drift, so at every checkpoint
the policy is scored on ``selection_tasks`` training tasks that no rollout uses (greedy and sampled success,
averaged; the environment's own success signal, never the held-out tasks), the starting policy included, and the best
one is the result; ``selection_tasks=0`` keeps the last. The summary gives the selected iteration and, when it is not
the last, the last policy's held-out success too. The selection reads the environment's true success, which a
learned reward model does not; to compare PPO with methods that keep their last policy, set ``selection_tasks=0``.

The critic and the policy run with dropout off throughout (`policy_model.disable_dropout`): the update's
log-probabilities are those the rollouts were sampled with, and the critic is fitted to the values it reported.

Defaults suit the bootstrapped tiny gridworld policy on 2 CPU cores (a few minutes). For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.ppo --policy_path Qwen/Qwen2.5-0.5B-Instruct --reward_model_path var/models/rm \\
        --prm_path var/models/prm --use_lora true --lora_r 16 --learning_rate 1e-5 --critic_learning_rate 1e-5 \\
        --batch_size 8 --rollouts_per_step 32 --critic_max_length 2048 --precision bf16 --max_steps 200

Example::

    from reward_models.finetune.ppo import main
    from reward_models.finetune.ppo_config import PPOConfig

    summary = main(PPOConfig(policy_path="var/policies/bootstrap", reward_model_path="var/models/rm",
                             prm_path="var/models/prm", output_dir="var/policies/ppo"))
    summary["metrics"]["final"]["sampled_success"]
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from reward_models.common.artifacts import checkpoint_dir
from reward_models.common.cli import cli
from reward_models.common.reporting import Reporter, SilentReporter
from reward_models.common.runtime import lora_settings, resolve_precision, seed_everything
from reward_models.finetune.artifacts import finished_policy, save_trained_policy
from reward_models.finetune.evaluation import evaluate_base, evaluate_policy, success_gain
from reward_models.finetune.loops import make_accelerator, out_of_time, resume_loop_checkpoint
from reward_models.finetune.policy_model import disable_dropout, load_policy_model
from reward_models.finetune.ppo_config import PPOConfig
from reward_models.finetune.ppo_rewards import JudgeRewards, RunningMoments, load_critic
from reward_models.finetune.ppo_run import PPORun, load_trainable

KIND = "ppo_policy"
CRITIC_DIR = "value_critic"


def _describe(name: str, figures: dict[str, float]) -> str:
    return (
        f"{name}: greedy {figures['greedy_success']:.3f} ± {figures['greedy_stderr']:.3f}, "
        f"sampled {figures['sampled_success']:.3f} ± {figures['sampled_stderr']:.3f} "
        f"on {figures['tasks']} held-out tasks"
    )


# --- main ----------------------------------------------------------------------------------------------------------


def setup_run(config: PPOConfig, reporter: Reporter) -> PPORun:
    """Load the policy, the reference, the critic and the judges, and prepare them with accelerate."""
    import torch

    seed_everything(config.seed)
    accelerator = make_accelerator(config)
    precision = resolve_precision(config.precision)
    loaded = load_policy_model(
        config.policy_path, use_lora=config.use_lora, lora_r=config.lora_r, dropout=False, precision=precision
    )
    # With LoRA on the starting policy, the reference is the same model with its adapters off: no second copy.
    reference = None
    if not (config.use_lora and config.reference == config.policy_path):
        reference = load_policy_model(
            config.reference,
            trainable=False,
            device=str(accelerator.device),
            field_name="reference_path",
        ).model
    # Under LoRA the critic's base is frozen too, and kept in the training precision like the policy's; the adapters
    # and the value head it trains stay fp32.
    half = {"bf16": "bfloat16", "fp16": "float16"}.get(precision) if config.use_lora else None
    critic, critic_tokenizer = load_critic(
        config.value_critic_path or config.policy_path,
        config.critic_max_length,
        "value_critic_path" if config.value_critic_path else "policy_path",
        dtype=half or "float32",
    )
    if config.use_lora:
        from peft import get_peft_model

        critic = get_peft_model(critic, lora_settings(config.lora_r, "TOKEN_CLS"))
        for parameter in critic.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.float()
    disable_dropout(critic)
    policy_optimizer = torch.optim.AdamW(
        [p for p in loaded.model.parameters() if p.requires_grad], lr=config.learning_rate, weight_decay=0.0
    )
    critic_optimizer = torch.optim.AdamW(
        [p for p in critic.parameters() if p.requires_grad], lr=config.critic_learning_rate, weight_decay=0.0
    )
    model, critic, policy_optimizer, critic_optimizer = accelerator.prepare(
        loaded.model, critic, policy_optimizer, critic_optimizer
    )
    judges = None
    if config.reward_source == "model":
        judges = JudgeRewards(
            config.reward_model_path,
            config.prm_path,
            prm_weight=config.prm_weight,
            layout=config.reward_layout,
            normalise=config.normalize_reward,
            device=accelerator.device,
            prm_shaping=config.prm_shaping,
        )
    return PPORun(
        config,
        accelerator,
        reporter,
        model,
        reference,
        critic,
        loaded.tokenizer,
        critic_tokenizer,
        loaded.settings,
        policy_optimizer,
        critic_optimizer,
        judges,
        state={},
    )


def main(config: PPOConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train the policy with PPO, keep the best checkpoint, evaluate it against the base on the held-out tasks and
    write `config.output_dir`; returns the summary (also kept in the manifest)."""
    reporter = reporter or SilentReporter()
    finished = finished_policy(config, KIND, reporter)
    if finished is not None:
        return finished
    run = setup_run(config, reporter)
    accelerator, judges = run.accelerator, run.judges
    start, state, resumed = resume_loop_checkpoint(accelerator, config)
    if resumed is not None:
        reporter.log(f"resuming from {resumed} (iteration {start} of {config.max_steps})")
        run.state = state
        if judges is not None:
            judges.moments = RunningMoments(**state["moments"])
            judges.prm_moments = RunningMoments(**state.get("prm_moments", {}))
    else:
        run.state = {"kl_beta": config.kl_beta, "train_seconds": 0.0, "selection": [], "best": None, "episodes": 0}
        run.state["base"] = evaluate_base(run.policy, run.tokenizer, run.settings, config, reporter)
        if run.state["base"]:
            reporter.log(_describe("base policy", run.state["base"]))
        if config.selection_tasks:
            run.select(0)

    started = time.monotonic() - run.state["train_seconds"]
    iteration = start
    while iteration < config.max_steps and not out_of_time(config, started):
        episodes = run.rollouts(iteration)
        run.state["episodes"] = run.state.get("episodes", 0) + len(episodes)
        batch = run.collect(episodes)
        iteration += 1
        figures = {**batch.figures, **run.update(batch, iteration)}
        reporter.progress(iteration, config.max_steps)
        if config.kl_target:
            error = max(-0.2, min(0.2, batch.figures["kl"] / config.kl_target - 1.0))
            run.state["kl_beta"] *= 1.0 + error * config.rollouts_per_step / config.kl_horizon
        figures["kl_beta"] = run.state["kl_beta"]
        run.state["figures"] = figures
        if iteration % config.logging_steps == 0:
            reporter.metric(iteration, **figures)
        if iteration % config.save_steps == 0 or iteration == config.max_steps:
            if config.selection_tasks:
                run.select(iteration)
            run.checkpoint(iteration, started)
    if iteration % config.save_steps and iteration != config.max_steps and config.selection_tasks:
        run.select(iteration)  # stopped by max_seconds between checkpoints
    train_seconds = time.monotonic() - started
    return _finish(run, iteration, train_seconds, resumed)


def _finish(run: PPORun, iteration: int, train_seconds: float, resumed: Path | None) -> dict[str, Any]:
    """Put the best policy in place, evaluate it on the held-out tasks and write the policy, its critic and the
    manifest."""
    config, state = run.config, run.state
    metrics: dict[str, Any] = {"base": state["base"], "training": state.get("figures", {})}
    metrics["selection"] = state["selection"]
    selected = iteration
    best = state["best"]
    if best is not None and best["iteration"] != iteration:
        metrics["last"] = evaluate_policy(
            run.policy, run.tokenizer, run.settings, config, seed=config.seed, reporter=run.reporter,
            whose="the last iteration's policy",
        )  # fmt: skip
        load_trainable(run.policy, checkpoint_dir(config.output_dir) / best["file"])
        selected = best["iteration"]
        run.reporter.log(f"keeping the policy of iteration {selected}, the best on the selection tasks")
    metrics["final"] = evaluate_policy(
        run.policy, run.tokenizer, run.settings, config, seed=config.seed, per_task=True, reporter=run.reporter
    )
    metrics["selected_iteration"] = selected
    metrics.update(success_gain(metrics))
    if metrics["final"]:
        run.reporter.log(_describe("trained policy", metrics["final"]))
    summary = {
        "metrics": metrics,
        "labels_used": 0,
        "iterations": iteration,
        "episodes": state.get("episodes", 0),  # trained on, in every process
        "train_seconds": train_seconds,
        "output_dir": str(config.output_dir),
        "resumed_from": str(resumed) if resumed is not None else None,
    }
    if run.accelerator.is_main_process:
        critic = run.accelerator.unwrap_model(run.critic)
        if config.use_lora:
            critic = critic.merge_and_unload()
        critic.save_pretrained(Path(config.output_dir) / CRITIC_DIR)
        run.critic_tokenizer.save_pretrained(Path(config.output_dir) / CRITIC_DIR)
        save_trained_policy(
            run.policy, run.tokenizer, run.settings, config, kind=KIND, metrics=metrics, summary=summary
        )
        shutil.rmtree(checkpoint_dir(config.output_dir), ignore_errors=True)
    run.accelerator.wait_for_everyone()
    return summary


if __name__ == "__main__":
    cli(PPOConfig, main, __doc__)
