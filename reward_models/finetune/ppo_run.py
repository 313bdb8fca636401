"""One PPO iteration and what it keeps between iterations: rollouts of fresh training tasks, the batch they make
(old and reference log-probabilities, rewards, values, GAE advantages and the critic's targets), the clipped policy
and value updates, scoring on the selection tasks, and checkpoints (`PPORun`).
"""

from __future__ import annotations

import json
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import checkpoint_dir
from reward_models.common.reporting import Reporter
from reward_models.envs.base import training_seeds
from reward_models.finetune.config import environment_factory, train_seeds_tasks
from reward_models.finetune.evaluation import greedy_and_sampled
from reward_models.finetune.loops import (
    LOOP_STATE_FILE,
    loop_checkpoints,
    rollout_progress,
    save_loop_checkpoint,
    shared_rollout,
)
from reward_models.finetune.policy_model import playing_policy
from reward_models.finetune.ppo_config import ROLLOUT_SEEDS, SELECTION_SEEDS, PPOConfig
from reward_models.finetune.ppo_rewards import (
    CriticWindow,
    JudgeRewards,
    charge_invalid_turns,
    critic_forward,
    episode_values,
    gae,
    oracle_rewards,
    whiten,
)
from reward_models.finetune.turn_batches import (
    TurnBatch,
    completion_logits,
    episode_encodings,
    like_lengths,
    pad_turns,
    token_logprobs,
)
from reward_models.policy.turns import TurnEncoding

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.policy.local import LocalCausalLMPolicy
    from reward_models.rollout import Episode


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
        return playing_policy(
            self.policy, self.tokenizer, self.settings, self.config, max_prompt_tokens=self.config.max_prompt_tokens
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

        rows: dict[int, torch.Tensor] = {}
        entropy_sum, tokens = 0.0, 0
        # Under the policy's autocast, a frozen reference computes exactly as the policy does (KL 0 while equal).
        with torch.no_grad(), self.accelerator.autocast():
            for chosen in like_lengths(encodings, range(len(encodings)), self.config.batch_size):
                batch = pad_turns([encodings[i] for i in chosen], self.tokenizer.pad_token_id)
                logits, batch = completion_logits(model, batch.to(self.accelerator.device), self.config.temperature)
                logprobs = token_logprobs(model, batch, logits)
                mask = batch.completion_mask.bool()
                entropy_sum += float(_entropy(logits, mask))
                tokens += int(mask[:, 1:].sum())
                rows |= {index: logprobs[row][mask[row]].float().cpu() for row, index in enumerate(chosen)}
        return [rows[index] for index in range(len(encodings))], entropy_sum / max(tokens, 1)

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
                # The minibatch's loss is a sum over its completion tokens (over their count): it is taken over
                # groups of like length, their gradients accumulating before the one optimiser step.
                groups = [
                    (group, pad_turns([batch.encodings[i] for i in group], self.tokenizer.pad_token_id).to(device))
                    for group in like_lengths(batch.encodings, turns[first : first + config.batch_size])
                ]
                tokens = sum(padded.completion_mask.sum() for _, padded in groups).clamp(min=1)
                for position, (chosen, padded) in enumerate(groups):
                    # Under several processes, gradients are synced once a minibatch, on its last group.
                    syncing = position == len(groups) - 1
                    with nullcontext() if syncing else accelerator.no_sync(self.model):
                        loss, ratio, log_ratio, mask = self._policy_loss(batch, advantages, chosen, padded, tokens)
                        accelerator.backward(loss)
                    with torch.no_grad():
                        policy_sums["policy_loss"] += float(loss)
                        outside = ((ratio - 1).abs() > config.clip_range).float()
                        policy_sums["clip_fraction"] += float((outside * mask).sum() / tokens)
                        policy_sums["approx_kl"] += float((((ratio - 1) - log_ratio) * mask).sum() / tokens)
                accelerator.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
                self.policy_optimizer.step()
                self.policy_optimizer.zero_grad(set_to_none=True)
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

    def _policy_loss(
        self, batch: Batch, advantages: torch.Tensor, chosen: list[int], padded: TurnBatch, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The clipped surrogate of the turns `chosen` (padded as `padded`), summed over their completion tokens
        and divided by the minibatch's `tokens`; with the per-token ratios, log-ratios and completion mask."""
        import torch

        config = self.config
        logits, padded = completion_logits(self.model, padded, config.temperature)
        new = token_logprobs(self.model, padded, logits)
        mask = padded.completion_mask.float()
        old = _scatter([batch.old_logprobs[i] for i in chosen], padded.completion_mask)
        advantage = advantages[chosen].to(mask.device).unsqueeze(1)
        log_ratio = (new - old) * mask
        ratio = log_ratio.exp()
        clipped = ratio.clamp(1 - config.clip_range, 1 + config.clip_range)
        surrogate = torch.max(-advantage * ratio, -advantage * clipped)
        loss = (surrogate * mask).sum() / tokens
        if config.entropy_coef:
            loss = loss - config.entropy_coef * _entropy(logits, padded.completion_mask) / tokens
        return loss, ratio, log_ratio, mask

    def select(self, iteration: int) -> None:
        """Score the policy on the selection tasks (mean of greedy and sampled success); keep its trainable weights
        as the best when it beats every earlier one."""
        config = self.config
        factory = environment_factory(config)
        seeds = list(training_seeds(factory(), config.selection_tasks, SELECTION_SEEDS))
        phase = f"scoring the policy of iteration {iteration} on the selection tasks"
        progress = partial(self.reporter.progress, phase=phase)
        greedy, sampled = greedy_and_sampled(
            self.local_policy(),
            factory,
            seeds,
            temperature=config.eval_temperature,
            seed=config.seed,
            progress=lambda mode: progress,
        )
        score = (greedy["success_rate"] + sampled["success_rate"]) / 2
        record = {"iteration": iteration, "greedy": greedy["success_rate"], "sampled": sampled["success_rate"]}
        self.state["selection"].append(record)
        self.reporter.metric(iteration, selection_greedy=record["greedy"], selection_sampled=record["sampled"])
        best = self.state["best"]
        if best is None or score > best["score"]:
            name = f"best-{iteration}.safetensors"
            if self.accelerator.is_main_process:
                save_trainable(self.policy, checkpoint_dir(config.output_dir) / name)
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


def save_trainable(model: PreTrainedModel, path: Path) -> None:
    """The trainable parameters (all weights, or the LoRA adapters) as one safetensors file."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if p.requires_grad}
    partial = path.with_name(path.name + ".part")
    save_file(tensors, str(partial))
    partial.replace(path)


def load_trainable(model: PreTrainedModel, path: Path) -> None:
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
