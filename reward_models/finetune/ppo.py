"""Tandem's own multi-turn PPO: rollouts in the environment, rewards from the reward model (trajectory level), the
PRM (dense, per step) and a KL penalty to the reference policy, per-turn advantages by GAE from a value critic that
PPO keeps training, and the clipped policy-gradient loss on the policy's own tokens only.

One iteration:

1. Roll out ``rollouts_per_step`` episodes of fresh training tasks (never the held-out ones), sampled at
   ``temperature``, in lockstep (`reward_models.rollout`).
2. Encode every turn as the policy saw and wrote it (`common.episode_encodings`: the prompt its chat template rendered
   with the task's tools, and the generated token ids), and take each completion token's log-probability under the
   policy (old) and the reference.
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
   are prompt tokens: `common.token_logprobs` gives them log-probability 0 and no gradient.

The critic: the `reward_models.value` critic in ``value_critic_path``, or, without one, a copy of the starting policy's
weights with a fresh one-output head (a separate model: policy and critic share no parameters, so the value loss never
moves the policy). It is saved beside the policy as ``value_critic/``, a directory `load_value_critic` reads.

Keeping the best policy. Policy gradient on a learned reward model can climb and then drift, so at every checkpoint
the policy is scored on ``selection_tasks`` training tasks that no rollout uses (greedy and sampled success,
averaged; the environment's own success signal, never the held-out tasks), the starting policy included, and the best
one is the result; ``selection_tasks=0`` keeps the last. The summary gives the selected iteration and, when it is not
the last, the last policy's held-out success too. The selection reads the environment's true success, which a
learned reward model does not; to compare PPO with methods that keep their last policy, set ``selection_tasks=0``.

The critic and the policy run with dropout off throughout (`common.disable_dropout`): the update's log-probabilities
are those the rollouts were sampled with, and the critic is fitted to the values it reported.

Defaults suit the bootstrapped tiny gridworld policy on 2 CPU cores (a few minutes). For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.ppo --policy_path Qwen/Qwen2.5-0.5B-Instruct --reward_model_path var/models/rm \\
        --prm_path var/models/prm --use_lora true --lora_r 16 --learning_rate 1e-5 --critic_learning_rate 1e-5 \\
        --batch_size 8 --rollouts_per_step 32 --critic_max_length 2048 --precision bf16 --max_steps 200

Example::

    from reward_models.finetune.ppo import PPOConfig, main

    summary = main(PPOConfig(policy_path="var/policies/bootstrap", reward_model_path="var/models/rm",
                             prm_path="var/models/prm", output_dir="var/policies/ppo"))
    summary["metrics"]["final"]["sampled_success"]
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import checkpoint_dir
from reward_models.common.cli import cli
from reward_models.common.config import require
from reward_models.common.reporting import Reporter, SilentReporter
from reward_models.common.runtime import resolve_precision, seed_everything
from reward_models.envs.base import training_seeds
from reward_models.finetune.common import (
    LOOP_STATE_FILE,
    PolicyTrainConfig,
    TurnBatch,
    disable_dropout,
    environment_factory,
    episode_encodings,
    evaluate_base,
    evaluate_policy,
    finished_policy,
    load_policy_model,
    loop_checkpoints,
    make_accelerator,
    out_of_time,
    pad_turns,
    resume_loop_checkpoint,
    rollout_progress,
    save_loop_checkpoint,
    save_trained_policy,
    shared_rollout,
    success_gain,
    token_logprobs,
    train_seeds_tasks,
)
from reward_models.finetune.ppo_rewards import (
    PRM_SHAPINGS,
    REWARD_LAYOUTS,
    CriticWindow,
    JudgeRewards,
    RunningMoments,
    charge_invalid_turns,
    critic_forward,
    episode_values,
    gae,
    load_critic,
    oracle_rewards,
    whiten,
)
from reward_models.policy.turns import TurnEncoding

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.policy.local import LocalCausalLMPolicy
    from reward_models.rollout import Episode

KIND = "ppo_policy"
REWARD_SOURCES = ("model", "oracle")
CRITIC_DIR = "value_critic"
# Rollout tasks of iteration i are the training seeds from ROLLOUT_SEEDS + i * rollouts_per_step up; the selection
# tasks start at SELECTION_SEEDS, so no selection task is ever rolled out in training.
ROLLOUT_SEEDS = 200_000
SELECTION_SEEDS = 900_000


@dataclass
class PPOConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/ppo", metadata={"help": "Where checkpoints and the policy go."})
    learning_rate: float = field(default=5e-5, metadata={"help": "The policy's learning rate (AdamW)."})
    max_steps: int = field(default=40, metadata={"help": "PPO iterations (each: rollouts, then ppo_epochs passes)."})
    batch_size: int = field(default=64, metadata={"help": "Turns per policy minibatch (one optimiser step)."})
    save_steps: int = field(
        default=5, metadata={"help": "Checkpoint (and score the policy on the selection tasks) every N iterations."}
    )
    logging_steps: int = field(default=1, metadata={"help": "Record metrics every this many iterations."})

    # Rewards
    reward_source: str = field(
        default="model",
        metadata={
            "choices": REWARD_SOURCES,
            "help": "model: the reward model (+ PRM); oracle: the environment's true reward (upper bound).",
        },
    )
    reward_model_path: str = field(
        default="",
        metadata={"help": "A reward model directory (reward_models.reward); optional when a PRM alone is the judge."},
    )
    reward_layout: str = field(
        default="full",
        metadata={
            "choices": REWARD_LAYOUTS,
            "help": "How PPO hands a trajectory to the reward model: full (the preference export), decisions, "
            "actions or moves; the reward model then applies the layout it was trained in.",
        },
    )
    prm_path: str = field(
        default="",
        metadata={
            "help": "A process reward model directory: shaping beside the reward model, or the only judge (then "
            "prm_shaping signed or centred, since penalty alone never pays for a good step)."
        },
    )
    prm_weight: float = field(default=0.5, metadata={"help": "Weight of the PRM's shaping on each turn."})
    prm_shaping: str = field(
        default="penalty",
        metadata={
            "choices": PRM_SHAPINGS,
            "help": "penalty: min(P(good) - 0.5, 0), a charge for bad steps only (no reward for length); signed: "
            "P(good) - 0.5 (a PRM that finds most steps good pays for longer episodes); centred: P(good) minus its "
            "running mean.",
        },
    )
    invalid_penalty: float = field(
        default=0.1,
        metadata={
            "help": "With the model reward source, charged on each turn the environment flags invalid "
            "(info['invalid'], the gridworld's unparsable action): a format check no judge has to learn, and one the "
            "policy cannot talk its way past. The oracle source keeps the environment's reward as it is."
        },
    )
    normalize_reward: bool = field(
        default=True, metadata={"help": "Scale reward-model scores by their running mean and standard deviation."}
    )
    kl_beta: float = field(default=0.02, metadata={"help": "KL penalty to the reference policy, per turn."})
    kl_target: float = field(
        default=0.0, metadata={"help": "Adapt kl_beta towards this per-turn KL (0: keep kl_beta fixed)."}
    )
    kl_horizon: int = field(default=2000, metadata={"help": "Episodes over which the adaptive KL coefficient moves."})

    # Advantages and the critic
    gamma: float = field(default=1.0, metadata={"help": "Discount per turn."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Whiten advantages over each iteration's turns."})
    value_critic_path: str = field(
        default="",
        metadata={"help": "A value critic (reward_models.value) to start from; empty: the policy with a new head."},
    )
    critic_learning_rate: float = field(default=1e-3, metadata={"help": "The critic's learning rate (AdamW)."})
    critic_batch_size: int = field(default=16, metadata={"help": "Critic step windows per optimiser step."})
    critic_max_length: int = field(
        default=256, metadata={"help": "Longest critic window in tokens, for a new critic (a trained one keeps its)."}
    )

    # PPO
    clip_range: float = field(default=0.2, metadata={"help": "Clip of the probability ratio."})
    value_clip: float = field(default=0.2, metadata={"help": "Clip of the value change from the rollout's values."})
    ppo_epochs: int = field(default=2, metadata={"help": "Passes over each iteration's turns."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus on the completion tokens."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clip (policy and critic)."})
    rollouts_per_step: int = field(default=32, metadata={"help": "Episodes per iteration."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the rollouts."})
    max_turns: int = field(default=100, metadata={"help": "Cap on turns per episode (the environment's comes first)."})
    max_prompt_tokens: int = field(
        default=4096,
        metadata={
            "help": "Longer prompts are cut to this many tokens, in the rollouts and the update alike: the system "
            "turn stays and the oldest turns go first (0: never cut)."
        },
    )

    # Selection
    selection_tasks: int = field(
        default=64,
        metadata={
            "help": "Training tasks (never rolled out) scoring the policy at each checkpoint (0: keep the last)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.reward_source in REWARD_SOURCES,
            "reward_source",
            f"must be one of {', '.join(REWARD_SOURCES)}, not {self.reward_source!r}",
        )
        require(
            self.reward_source == "oracle" or bool(self.reward_model_path or self.prm_path),
            "reward_model_path",
            "is required unless reward_source is oracle or a prm_path is given",
        )
        require(
            self.reward_layout in REWARD_LAYOUTS,
            "reward_layout",
            f"must be one of {', '.join(REWARD_LAYOUTS)}, not {self.reward_layout!r}",
        )
        for name in ("reward_model_path", "prm_path", "value_critic_path"):
            path = getattr(self, name)
            require(not path or Path(path).is_dir(), name, f"no such directory: {path}")
        require(self.prm_weight >= 0, "prm_weight", "must be 0 or positive")
        require(self.invalid_penalty >= 0, "invalid_penalty", "must be 0 or positive")
        require(
            self.prm_shaping in PRM_SHAPINGS,
            "prm_shaping",
            f"must be one of {', '.join(PRM_SHAPINGS)}, not {self.prm_shaping!r}",
        )
        require(
            self.reward_source == "oracle" or bool(self.reward_model_path) or self.prm_shaping != "penalty",
            "prm_shaping",
            "a PRM alone needs signed or centred: penalty never pays for a good step",
        )
        require(self.kl_beta >= 0, "kl_beta", "must be 0 or positive")
        require(self.kl_target >= 0, "kl_target", "must be 0 (fixed kl_beta) or positive")
        require(self.kl_horizon > 0, "kl_horizon", "must be positive")
        require(0.0 <= self.gamma <= 1.0, "gamma", "must be between 0 and 1")
        require(0.0 <= self.lam <= 1.0, "lam", "must be between 0 and 1")
        require(0 < self.critic_learning_rate < 1, "critic_learning_rate", "must be between 0 and 1")
        for name in ("critic_batch_size", "ppo_epochs", "rollouts_per_step", "max_turns"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.critic_max_length >= 8, "critic_max_length", "must be at least 8")
        require(self.clip_range > 0, "clip_range", "must be positive")
        require(self.value_clip > 0, "value_clip", "must be positive")
        require(self.entropy_coef >= 0, "entropy_coef", "must be 0 or positive")
        require(self.max_grad_norm > 0, "max_grad_norm", "must be positive")
        require(self.temperature > 0, "temperature", "must be positive")
        require(self.max_prompt_tokens >= 0, "max_prompt_tokens", "must be 0 (never cut) or positive")
        require(self.selection_tasks >= 0, "selection_tasks", "must be 0 (keep the last policy) or positive")
        require(
            ROLLOUT_SEEDS + self.max_steps * self.rollouts_per_step <= SELECTION_SEEDS,
            "max_steps",
            f"times rollouts_per_step must stay below {SELECTION_SEEDS - ROLLOUT_SEEDS} tasks",
        )


# --- one iteration ------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One iteration's rollouts, ready for the update. Per turn: its encoding, the old log-probabilities of its
    completion tokens and its advantage. Per critic window: the rollout's values and the returns (GAE targets) at
    its read positions."""

    encodings: list[TurnEncoding]
    old_logprobs: list[torch.Tensor]
    advantages: list[float]
    windows: list[CriticWindow]
    old_values: list[list[float]]
    returns: list[list[float]]
    figures: dict[str, float]


@dataclass
class PPORun:
    """The loop's pieces (`setup_run` builds them; `main` drives them): one iteration is ``collect(rollouts(i))``
    then ``update``. `state` is what a checkpoint keeps besides the models and optimisers."""

    config: PPOConfig
    accelerator: Accelerator
    reporter: Reporter
    model: PreTrainedModel
    reference: PreTrainedModel | None  # None: the LoRA model with its adapters off
    critic: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    critic_tokenizer: PreTrainedTokenizerBase
    settings: dict[str, Any]
    policy_optimizer: torch.optim.Optimizer
    critic_optimizer: torch.optim.Optimizer
    judges: JudgeRewards | None
    state: dict[str, Any]

    @property
    def policy(self) -> PreTrainedModel:
        return self.accelerator.unwrap_model(self.model)

    def local_policy(self) -> LocalCausalLMPolicy:
        from reward_models.policy.local import LocalCausalLMPolicy

        return LocalCausalLMPolicy.from_model(
            self.policy,
            self.tokenizer,
            history_window=self.settings["history_window"],
            max_new_tokens=self.settings["max_new_tokens"],
            batch_size=self.config.generation_batch_size,
            max_prompt_tokens=self.config.max_prompt_tokens,
        )

    def rollouts(self, iteration: int) -> list[Episode]:
        """The iteration's episodes: fresh training tasks, sampled from the current policy."""
        config = self.config
        first = ROLLOUT_SEEDS + iteration * config.rollouts_per_step
        episodes = shared_rollout(
            self.accelerator,
            environment_factory(config),
            train_seeds_tasks(config, config.rollouts_per_step, start=first),
            self.local_policy(),
            greedy=False,
            temperature=config.temperature,
            seed=config.seed * 1_000_003 + iteration,
            render=False,
            max_turns=config.max_turns,
            progress=rollout_progress(self.reporter, iteration + 1, config.max_steps),
        )
        return [episode for episode in episodes if episode.steps]

    def turn_logprobs(self, model: PreTrainedModel, encodings: list[TurnEncoding]) -> tuple[list[torch.Tensor], float]:
        """Each turn's completion-token log-probabilities under `model` (no gradient), and the mean entropy of the
        distributions those tokens were drawn from."""
        import torch

        rows: list[torch.Tensor] = []
        entropy_sum, tokens = 0.0, 0
        # Under the policy's autocast, a frozen reference computes exactly as the policy does (KL 0 while equal).
        with torch.no_grad(), self.accelerator.autocast():
            for first in range(0, len(encodings), self.config.batch_size):
                batch = pad_turns(encodings[first : first + self.config.batch_size], self.tokenizer.pad_token_id)
                batch = batch.to(self.accelerator.device)
                logits = _logits(model, batch, self.config.temperature)
                logprobs = token_logprobs(model, batch, logits)
                mask = batch.completion_mask.bool()
                entropy_sum += float(_entropy(logits, mask))
                tokens += int(mask[:, 1:].sum())
                rows += [logprobs[row][mask[row]].float().cpu() for row in range(logprobs.shape[0])]
        return rows, entropy_sum / max(tokens, 1)

    def collect(self, episodes: list[Episode]) -> Batch:
        """Encode the turns, score them (old and reference log-probabilities, rewards, values), and compute the
        advantages and the critic's targets."""
        config = self.config
        # The completions as generated (token ids), so the ratios are exactly on-policy.
        encodings = [
            encoding
            for episode in episodes
            for encoding in episode_encodings(
                self.tokenizer, episode, self.settings["history_window"], max_prompt_tokens=config.max_prompt_tokens
            )
        ]
        self.model.eval()
        old, entropy = self.turn_logprobs(self.model, encodings)
        if self.reference is None:
            with self.policy.disable_adapter():
                reference, _ = self.turn_logprobs(self.model, encodings)
        else:
            reference, _ = self.turn_logprobs(self.reference, encodings)
        self.model.train()
        kl = [float((o - r).sum()) for o, r in zip(old, reference, strict=True)]

        figures: dict[str, float] = {}
        if self.judges is None:
            task_rewards = oracle_rewards(episodes)
        else:
            task_rewards, figures = self.judges(episodes)
            invalid = charge_invalid_turns(task_rewards, episodes, config.invalid_penalty)
            figures["invalid_share"] = invalid / sum(episode.length for episode in episodes)
        rewards, cursor = [], 0
        for turns in task_rewards:
            rewards.append([reward - self.state["kl_beta"] * kl[cursor + t] for t, reward in enumerate(turns)])
            cursor += len(turns)

        self.critic.eval()
        values, last_values, windows = episode_values(
            self.accelerator.unwrap_model(self.critic), self.critic_tokenizer, episodes, config.critic_batch_size
        )
        self.critic.train()
        advantages, returns = [], []
        for episode_rewards, before_turns, last_value in zip(rewards, values, last_values, strict=True):
            episode_advantages, episode_returns = gae(
                episode_rewards, before_turns, config.gamma, config.lam, last_value=last_value
            )
            advantages += episode_advantages
            returns.append(episode_returns)
        if config.whiten_advantages and len(advantages) > 1:
            advantages = whiten(advantages)

        flat_values = [value for episode_values in values for value in episode_values]
        flat_returns = [value for episode_returns in returns for value in episode_returns]
        figures.update(
            {
                "success_rate": sum(episode.success for episode in episodes) / len(episodes),
                "mean_reward": sum(sum(turns) for turns in task_rewards) / len(episodes),
                "mean_length": sum(episode.length for episode in episodes) / len(episodes),
                "kl": sum(kl) / len(kl),
                "entropy": entropy,
                "value_mean": sum(flat_values) / len(flat_values),
                "explained_variance": explained_variance(flat_returns, flat_values),
            }
        )
        return Batch(
            encodings=encodings,
            old_logprobs=old,
            advantages=advantages,
            windows=windows,
            old_values=[[values[w.episode][step] for step in w.steps] for w in windows],
            returns=[[returns[w.episode][step] for step in w.steps] for w in windows],
            figures=figures,
        )

    def update(self, batch: Batch, iteration: int) -> dict[str, float]:
        """`ppo_epochs` passes of the clipped policy loss over the turns and of the clipped value loss over the
        critic's windows, in shuffled minibatches; returns the mean losses, the clip fractions and the approximate
        KL between the policy before and after each step. Reports progress (which may cancel) every step."""
        import torch

        config, accelerator = self.config, self.accelerator
        device = accelerator.device
        shuffler = random.Random(config.seed * 7919 + iteration)
        advantages = torch.tensor(batch.advantages, dtype=torch.float32)
        policy_sums = {"policy_loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
        critic_sums = {"value_loss": 0.0, "value_clip_fraction": 0.0}
        policy_steps = critic_steps_done = 0
        for _ in range(config.ppo_epochs):
            turns = list(range(len(batch.encodings)))
            shuffler.shuffle(turns)
            for first in range(0, len(turns), config.batch_size):
                chosen = turns[first : first + config.batch_size]
                padded = pad_turns([batch.encodings[i] for i in chosen], self.tokenizer.pad_token_id).to(device)
                logits = _logits(self.model, padded, config.temperature)
                new = token_logprobs(self.model, padded, logits)
                mask = padded.completion_mask.float()
                old = _scatter([batch.old_logprobs[i] for i in chosen], padded.completion_mask)
                advantage = advantages[chosen].to(device).unsqueeze(1)
                log_ratio = (new - old) * mask
                ratio = log_ratio.exp()
                clipped = ratio.clamp(1 - config.clip_range, 1 + config.clip_range)
                surrogate = torch.max(-advantage * ratio, -advantage * clipped)
                tokens = mask.sum().clamp(min=1)
                loss = (surrogate * mask).sum() / tokens
                if config.entropy_coef:
                    loss = loss - config.entropy_coef * _entropy(logits, padded.completion_mask) / tokens
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
                self.policy_optimizer.step()
                self.policy_optimizer.zero_grad(set_to_none=True)
                with torch.no_grad():
                    policy_sums["policy_loss"] += float(loss)
                    outside = ((ratio - 1).abs() > config.clip_range).float()
                    policy_sums["clip_fraction"] += float((outside * mask).sum() / tokens)
                    policy_sums["approx_kl"] += float((((ratio - 1) - log_ratio) * mask).sum() / tokens)
                policy_steps += 1
                self.reporter.progress(iteration - 1, config.max_steps)

            windows = list(range(len(batch.windows)))
            shuffler.shuffle(windows)
            for first in range(0, len(windows), config.critic_batch_size):
                chosen = windows[first : first + config.critic_batch_size]
                values = critic_forward(
                    self.critic, [batch.windows[i] for i in chosen], self.critic_tokenizer.pad_token_id
                )
                old_values = torch.tensor([v for i in chosen for v in batch.old_values[i]], device=values.device)
                targets = torch.tensor([g for i in chosen for g in batch.returns[i]], device=values.device)
                clipped_values = old_values + (values - old_values).clamp(-config.value_clip, config.value_clip)
                value_loss = 0.5 * torch.max((values - targets) ** 2, (clipped_values - targets) ** 2).mean()
                accelerator.backward(value_loss)
                accelerator.clip_grad_norm_(self.critic.parameters(), config.max_grad_norm)
                self.critic_optimizer.step()
                self.critic_optimizer.zero_grad(set_to_none=True)
                critic_sums["value_loss"] += float(value_loss.detach())
                moved = ((values - old_values).abs() > config.value_clip).float().mean()
                critic_sums["value_clip_fraction"] += float(moved)
                critic_steps_done += 1
                self.reporter.progress(iteration - 1, config.max_steps)
        return {
            **{name: total / max(policy_steps, 1) for name, total in policy_sums.items()},
            **{name: total / max(critic_steps_done, 1) for name, total in critic_sums.items()},
        }

    def select(self, iteration: int) -> None:
        """Score the policy on the selection tasks (mean of greedy and sampled success); keep its trainable weights
        as the best when it beats every earlier one."""
        from reward_models.rollout import evaluate_success

        config = self.config
        factory = environment_factory(config)
        seeds = list(training_seeds(factory(), config.selection_tasks, SELECTION_SEEDS))
        policy = self.local_policy()
        phase = f"scoring the policy of iteration {iteration} on the selection tasks"
        progress = partial(self.reporter.progress, phase=phase)
        greedy = evaluate_success(policy, factory, seeds, greedy=True, seed=config.seed, progress=progress)
        sampled = evaluate_success(
            policy,
            factory,
            seeds,
            greedy=False,
            temperature=config.eval_temperature,
            seed=config.seed,
            progress=progress,
        )
        score = (greedy["success_rate"] + sampled["success_rate"]) / 2
        record = {"iteration": iteration, "greedy": greedy["success_rate"], "sampled": sampled["success_rate"]}
        self.state["selection"].append(record)
        self.reporter.metric(iteration, selection_greedy=record["greedy"], selection_sampled=record["sampled"])
        best = self.state["best"]
        if best is None or score > best["score"]:
            name = f"best-{iteration}.safetensors"
            if self.accelerator.is_main_process:
                _save_trainable(self.policy, checkpoint_dir(config.output_dir) / name)
            self.state["best"] = {"iteration": iteration, "score": score, "file": name}
            self.reporter.log(f"iteration {iteration}: best so far on the selection tasks ({score:.3f})")

    def checkpoint(self, iteration: int, started: float) -> None:
        self.state["train_seconds"] = time.monotonic() - started
        if self.judges is not None:
            self.state["moments"] = self.judges.moments.state()
            self.state["prm_moments"] = self.judges.prm_moments.state()
        save_loop_checkpoint(self.accelerator, self.config, iteration, self.state)
        if self.accelerator.is_main_process:
            _remove_unreferenced_best(self.config, self.state)


def _logits(model: PreTrainedModel, batch: TurnBatch, temperature: float) -> torch.Tensor:
    """The logits the rollouts sampled from: at `temperature`, as generate() scales them."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return logits / temperature if temperature != 1.0 else logits


def _entropy(logits: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """The summed entropy of the distributions the completion tokens were drawn from (each read one position
    earlier); only those rows of the logits go through the softmax, which matters with a large vocabulary."""
    logprobs = logits[:, :-1][completion_mask[:, 1:].bool()].float().log_softmax(-1)
    return -(logprobs.exp() * logprobs).sum()


def _scatter(rows: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Per-turn completion-token values back into a tensor shaped like `mask` (0 off the completion)."""
    import torch

    full = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    full[mask.bool()] = torch.cat(rows).to(mask.device)
    return full


def explained_variance(targets: list[float], predictions: list[float]) -> float:
    """``1 - Var(G - V) / Var(G)`` (0 when the targets are constant)."""
    n = len(targets)
    mean = sum(targets) / n
    variance = sum((g - mean) ** 2 for g in targets) / n
    if variance == 0:
        return 0.0
    residuals = [g - v for g, v in zip(targets, predictions, strict=True)]
    residual_mean = sum(residuals) / n
    return 1.0 - sum((r - residual_mean) ** 2 for r in residuals) / n / variance


def _save_trainable(model: PreTrainedModel, path: Path) -> None:
    """The trainable parameters (all weights, or the LoRA adapters) as one safetensors file."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if p.requires_grad}
    partial = path.with_name(path.name + ".part")
    save_file(tensors, str(partial))
    partial.replace(path)


def _load_trainable(model: PreTrainedModel, path: Path) -> None:
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    if unexpected:
        raise ValueError(f"{path} does not fit the policy: unexpected weights {unexpected[:3]}")


def _remove_unreferenced_best(config: PPOConfig, state: dict[str, Any]) -> None:
    """Best-policy files that neither the kept checkpoints nor the current state name (a crash can leave one from
    iterations that are done again after resuming)."""
    referenced = {(state.get("best") or {}).get("file")}
    for folder in loop_checkpoints(config):
        saved = json.loads((folder / LOOP_STATE_FILE).read_text())
        referenced.add((saved.get("best") or {}).get("file"))
    for path in checkpoint_dir(config.output_dir).glob("best-*.safetensors"):
        if path.name not in referenced:
            path.unlink()


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
        from peft import LoraConfig, TaskType, get_peft_model

        lora = LoraConfig(task_type=TaskType.TOKEN_CLS, r=config.lora_r, lora_alpha=2 * config.lora_r)
        critic = get_peft_model(critic, lora)
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
        _load_trainable(run.policy, checkpoint_dir(config.output_dir) / best["file"])
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
