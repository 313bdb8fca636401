"""Nash-style policy training from a preference model, on multi-turn rollouts in the environment.

Two methods, chosen by ``method``:

- ``nash_md``: Nash mirror descent (Munos et al. 2023), as TRL's former ``NashMDTrainer`` ran it. For each training
  task the policy plays one episode, and the geometric mixture of the policy and the reference,
  pi_mix(token) ∝ pi(token)^(1 - alpha) * pi_ref(token)^alpha (renormalised over the vocabulary at every token it
  writes, `mixture_logprobs`), plays another. The preference model gives P(y > y'), and the policy takes a
  REINFORCE step on it with 1/2 as the control variate, plus a KL penalty to the reference:

      loss = mean over episodes of [ kl_beta * sum_t sg(log pi(t) - log pi_ref(t)) * log pi(t)
                                     - (P(y > y') - 1/2) * sum_t log pi(t) ]

  (TRL's loss; ``sg`` stops the gradient, ``t`` runs over every token the policy wrote in every turn of y).
- ``spo``: self-play preference optimisation (Swamy et al. 2024, "A Minimaximalist Approach to Reinforcement
  Learning from Human Feedback"). ``samples_per_task`` episodes per task; each episode's reward is its win rate
  against the other samples of its task under the preference model (`win_rates`), and the policy maximises that
  reward with a policy gradient, as the paper does, with no reference policy and no KL penalty (`reinforce_loss`;
  ``kl_beta``, ``mixture_alpha`` and ``reference_path`` are Nash-MD's and SPO ignores them):

      loss = mean over episodes of [ - (w(y) - mean of w over its task's samples) * sum_t log pi(t) ]

  The paper optimises the win rates with PPO. Here each batch of rollouts gets exactly one optimiser step, taken at
  the policy that sampled it: PPO's importance ratio is 1 there, inside its clip range, so the gradient of its
  clipped objective is this REINFORCE gradient (clipping only acts on further steps over the same rollouts, which
  are not taken). The rewards are per episode, so the group's mean win rate is the baseline instead of PPO's learned
  critic (as in GRPO and RLOO); `scale_advantages` optionally divides by the group's standard deviation. Win rates
  of a symmetric preference model always average 1/2 within a group, so the baseline is 1/2.

The policy is loaded with its dropout switched off (`policy_model.disable_dropout`, as PPO's), so the update passes
score it as it sampled the rollouts: the log-probabilities in the loss are those of the policy that played, and a
frozen reference equal to the policy gives them exactly (KL 0), also for checkpoints trained with dropout (GPT-2's 0.1
everywhere).

Only the policy's own tokens (every assistant turn, exactly the token ids it generated) are in the loss: turns are
encoded with ``turn_batches.episode_encodings`` and scored with ``turn_batches.token_logprobs``, so observation and
tool-result tokens are context only. The preference model reads each episode's conversation as the `preference` export
lays out a trajectory (the prompt, then the rest of the conversation), with the task's tools.

The mixture policy (`MixturePolicy`) decodes token by token with both models' KV caches and samples from the
renormalised mixed distribution; it plugs into ``reward_models.rollout.rollout`` like any policy.

A larger step with a weaker KL term (lr 3e-4, kl_beta 0.02) lets the KL to the reference run away and success
fall; the defaults keep both moderate.

Defaults suit the tiny gridworld policy on a CPU (a few minutes). For a 0.5-8B model on a GPU::

    python -m reward_models.finetune.nash --method nash_md --policy_path var/policies/qwen-sft \\
        --preference_model_path var/models/pm --output_dir var/policies/nash --precision bf16 \\
        --learning_rate 1e-6 --batch_size 16 --micro_batch_turns 8 --max_steps 200 --kl_beta 0.05
    # 7-8B: add --use_lora true --lora_r 16 --learning_rate 2e-5
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import read_manifest, trained_model
from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, choice, require
from reward_models.common.reporting import Reporter, SilentReporter
from reward_models.finetune.artifacts import finished_policy, save_trained_policy
from reward_models.finetune.config import PolicyTrainConfig, environment_factory, train_seeds_tasks
from reward_models.finetune.evaluation import evaluate_base, evaluate_policy, success_gain
from reward_models.finetune.loops import (
    make_accelerator,
    out_of_time,
    resume_loop_checkpoint,
    rollout_progress,
    save_loop_checkpoint,
    shared_rollout,
)
from reward_models.finetune.nash_mixture import MixturePolicy
from reward_models.finetune.nash_objectives import (
    group_advantages,
    preference_pair,
    reinforce_kl_loss,
    reinforce_loss,
    win_rates,
)
from reward_models.finetune.policy_model import load_policy_model, playing_policy
from reward_models.finetune.turn_batches import episode_encodings, pad_turns, token_logprobs
from reward_models.rollout import episode_messages

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reward_models.rollout import Episode

KIND = "policy"
METHODS = ("nash_md", "spo")


@dataclass
class NashConfig(PolicyTrainConfig):
    output_dir: str = field(default="var/policies/nash", metadata={"help": "Where checkpoints and the policy go."})
    method: str = choice(
        "nash_md",
        METHODS,
        "nash_md (mixture opponent, KL to the reference) or spo (k-sample win rates, no reference or KL).",
    )
    preference_model_path: str = field(
        default="",
        metadata={"help": "A preference model (finetune.preference_model) or reward model directory: P(a > b)."},
    )
    learning_rate: float = field(
        default=1e-4, metadata={"help": "Peak learning rate (AdamW, constant after warm-up)."}
    )
    max_steps: int = field(default=30, metadata={"help": "Iterations: rollouts of one batch of tasks, one update."})
    batch_size: int = field(default=32, metadata={"help": "Training tasks per iteration."})
    save_steps: int = field(default=10, metadata={"help": "Checkpoint every this many iterations (for resume)."})
    logging_steps: int = field(default=1, metadata={"help": "Record metrics every this many iterations."})
    mixture_alpha: float = field(
        default=0.5, metadata={"help": "Nash-MD: the reference's weight in the geometric mixture (0: self-play)."}
    )
    kl_beta: float = field(
        default=0.1, metadata={"help": "Nash-MD: weight of the KL penalty to the reference policy (SPO has none)."}
    )
    samples_per_task: int = field(default=4, metadata={"help": "SPO: episodes per task whose win rates are compared."})
    scale_advantages: bool = field(
        default=False, metadata={"help": "SPO: divide each group's advantages by its standard deviation (GRPO-style)."}
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the training rollouts."})
    max_turns: int = field(default=100, metadata={"help": "Most policy turns per training episode."})
    micro_batch_turns: int = field(
        default=256, metadata={"help": "Turns per forward/backward pass (gradients accumulate over the iteration)."}
    )
    max_length: int = field(default=1024, metadata={"help": "Longest turn in tokens; longer prompts are cut."})
    warmup_steps: int = field(default=2, metadata={"help": "Linear learning-rate warm-up iterations."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.preference_model_path), "preference_model_path", "is required")
        require(0.0 <= self.mixture_alpha <= 1.0, "mixture_alpha", "must be between 0 and 1")
        require(self.kl_beta >= 0, "kl_beta", "must be 0 or positive")
        require(self.samples_per_task >= 2, "samples_per_task", "must be at least 2 (win rates need opponents)")
        require(self.temperature > 0, "temperature", "must be positive")
        for name in ("max_turns", "micro_batch_turns", "max_length"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.warmup_steps >= 0, "warmup_steps", "must be 0 or positive")
        require(self.max_grad_norm > 0, "max_grad_norm", "must be positive")


# --- training ----------------------------------------------------------------------------------------------------


def preference_labels_used(path: str | Path) -> int:
    """How many comparisons the preference (or reward) model trained on, from its manifest."""
    summary = read_manifest(path).get("summary") or {}
    return int(summary.get("labels_used") or summary.get("train_samples") or 0)


def main(config: NashConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train the policy with Nash-MD or SPO, evaluate it before and after on held-out tasks, and write the policy
    directory to `config.output_dir`; returns the summary (also kept in the manifest)."""
    import torch

    from reward_models.finetune.preference_scoring import load_preference_model

    reporter = reporter or SilentReporter()
    finished = finished_policy(config, KIND, reporter)
    if finished is not None:
        return finished
    accelerator = make_accelerator(config)
    torch.manual_seed(config.seed)
    policy = load_policy_model(config.policy_path, use_lora=config.use_lora, lora_r=config.lora_r, dropout=False)
    tokenizer, settings = policy.tokenizer, policy.settings
    reference = None  # SPO plays the policy against itself alone
    if config.method == "nash_md":
        frozen = load_policy_model(
            config.reference, trainable=False, device=str(accelerator.device), field_name="reference_path"
        )
        if len(frozen.tokenizer) != len(tokenizer):
            raise ConfigError("reference_path", "the reference policy's vocabulary differs from the policy's")
        reference = frozen.model
    preference = load_preference_model(config.preference_model_path, str(accelerator.device))
    labels_used = preference_labels_used(config.preference_model_path)
    pad_id = tokenizer.pad_token_id

    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else 1.0
    )
    model, optimizer, scheduler = accelerator.prepare(policy.model, optimizer, scheduler)
    start, state, resumed = resume_loop_checkpoint(accelerator, config)
    if resumed is not None:
        reporter.log(f"resuming from {resumed} (iteration {start})")
    if "base" in state:
        base = state["base"]
    else:
        reporter.log(f"evaluating the starting policy on {config.eval_tasks} held-out tasks")
        base = evaluate_base(accelerator.unwrap_model(model), tokenizer, settings, config, reporter)
    history: list[dict[str, float]] = state.get("history", [])
    seconds = float(state.get("train_seconds", 0.0))

    factory = environment_factory(config)
    per_step = config.batch_size
    tasks = train_seeds_tasks(config, config.max_steps * per_step)
    began = time.monotonic()
    stopped_by_time = False
    for step in range(start, config.max_steps):
        if out_of_time(config, began):
            stopped_by_time = True
            reporter.log(f"max_seconds reached after {step} iterations")
            break
        batch_tasks = tasks[step * per_step : (step + 1) * per_step]
        unwrapped = accelerator.unwrap_model(model)
        sampler = playing_policy(unwrapped, tokenizer, settings, config)
        seed = config.seed * 1_000_003 + step
        progress = rollout_progress(reporter, step + 1, config.max_steps)
        figures: dict[str, float] = {}
        if config.method == "nash_md":
            episodes = shared_rollout(
                accelerator, factory, batch_tasks, sampler, greedy=False, temperature=config.temperature,
                seed=2 * seed, render=False, max_turns=config.max_turns, progress=progress,
            )  # fmt: skip
            mixture = MixturePolicy(
                unwrapped, reference, tokenizer, config.mixture_alpha,
                history_window=settings["history_window"], max_new_tokens=settings["max_new_tokens"],
                batch_size=config.generation_batch_size,
            )  # fmt: skip
            # The same split of the tasks, so that each episode meets its opponent on the same task.
            opponents = shared_rollout(
                accelerator, factory, batch_tasks, mixture, greedy=False, temperature=config.temperature,
                seed=2 * seed + 1, render=False, max_turns=config.max_turns, progress=progress,
            )  # fmt: skip
            pairs = [preference_pair(episode, opponent) for episode, opponent in zip(episodes, opponents, strict=True)]
            probabilities = preference.probability(pairs, [episode.tools or None for episode in episodes])
            advantages = [p - 0.5 for p in probabilities]
            figures["preference"] = _mean(probabilities)
            figures["opponent_success"] = _mean([float(e.success) for e in opponents])
        else:
            k = config.samples_per_task
            episodes = shared_rollout(
                accelerator, factory, batch_tasks, sampler, samples_per_task=k, greedy=False,
                temperature=config.temperature, seed=2 * seed, render=False, max_turns=config.max_turns,
                progress=progress,
            )  # fmt: skip
            advantages, rates = [], []
            for group in range(len(batch_tasks)):
                members = episodes[group * k : (group + 1) * k]
                cut = len(members[0].prompt)
                completions = [episode_messages(episode)[cut:] for episode in members]
                matrix = preference.win_matrix(members[0].prompt, completions, members[0].tools or None)
                group_rates = win_rates(matrix)
                rates += group_rates
                advantages += group_advantages(group_rates, config.scale_advantages)
            figures["win_rate_spread"] = _mean([abs(rate - 0.5) for rate in rates])
        figures["train_success"] = _mean([float(e.success) for e in episodes])
        figures["episode_length"] = _mean([float(e.length) for e in episodes])

        loss_value, kl_total, tokens = _update(
            accelerator, model, reference, tokenizer, settings, episodes, advantages, config, pad_id
        )
        accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        figures.update(loss=loss_value, completion_tokens=float(tokens))
        if kl_total is not None:
            figures["kl"] = kl_total / len(episodes)
        figures = {name: float(value) for name, value in figures.items()}
        history.append({"step": step + 1, **figures})
        if (step + 1) % config.logging_steps == 0:
            reporter.metric(step + 1, **figures)
        if (step + 1) % config.save_steps == 0 and step + 1 < config.max_steps:
            elapsed = seconds + time.monotonic() - began
            save_loop_checkpoint(
                accelerator, config, step + 1, {"base": base, "history": history, "train_seconds": elapsed}
            )
        # After the checkpoint: a cancel raised here keeps this iteration's work.
        reporter.progress(step + 1, config.max_steps)
    seconds += time.monotonic() - began

    trained = trained_model(accelerator, model)
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    reporter.log("evaluating the trained policy")
    final = evaluate_policy(trained, tokenizer, settings, config, seed=config.seed, per_task=True, reporter=reporter)
    metrics: dict[str, Any] = {"base": base, "final": final}
    metrics.update(success_gain(metrics))
    if history:
        metrics["first"] = history[0]
        metrics["last"] = history[-1]
    summary = {
        "method": config.method,
        "metrics": metrics,
        "history": history,
        "labels_used": labels_used,
        "iterations": len(history),
        "stopped_by_time": stopped_by_time,
        "train_seconds": seconds,
        "output_dir": str(config.output_dir),
        "resumed_from": str(resumed) if resumed else None,
    }
    if accelerator.is_main_process:
        save_trained_policy(trained, tokenizer, settings, config, kind=KIND, metrics=metrics, summary=summary)
    accelerator.wait_for_everyone()
    return summary


def _update(
    accelerator: Any,
    model: PreTrainedModel,
    reference: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    settings: dict[str, Any],
    episodes: Sequence[Episode],
    advantages: Sequence[float],
    config: NashConfig,
    pad_id: int,
) -> tuple[float, float | None, int]:
    """Accumulate the gradient of `reinforce_kl_loss` (Nash-MD) or, without a `reference`, of `reinforce_loss`
    (SPO) over every turn of `episodes`, in micro-batches of turns; returns the loss, the summed KL estimate
    sum(log pi - log pi_ref) (None without a reference) and the number of completion tokens. The tokens are scored
    at the rollouts' sampling temperature, both models alike, as PPO does: the gradient is on-policy at any
    temperature."""
    import torch

    encodings, owners = [], []
    for index, episode in enumerate(episodes):
        if episode.steps:
            encodings += episode_encodings(tokenizer, episode, settings["history_window"])
            owners += [index] * len(episode.steps)
    # Its dropout was switched off at loading: the loss is on the log-probabilities of the policy that played.
    model.train()
    loss_total, kl_total, tokens = 0.0, 0.0, 0
    coefficient = torch.tensor(advantages, dtype=torch.float32)
    for start in range(0, len(encodings), config.micro_batch_turns):
        chunk = slice(start, start + config.micro_batch_turns)
        batch = pad_turns(encodings[chunk], pad_id, config.max_length).to(accelerator.device)
        with accelerator.autocast():
            logprobs = token_logprobs(model, batch, temperature=config.temperature)
        coefficients = coefficient[owners[chunk]].to(logprobs.device)
        if reference is None:
            loss = reinforce_loss(logprobs, coefficients, len(episodes))
        else:
            with torch.no_grad(), accelerator.autocast():  # the policy's numerics: KL 0 while they are the same
                reference_logprobs = token_logprobs(reference, batch, temperature=config.temperature)
            loss = reinforce_kl_loss(logprobs, reference_logprobs, coefficients, config.kl_beta, len(episodes))
            kl_total += float((logprobs.detach() - reference_logprobs).sum())
        accelerator.backward(loss)
        loss_total += loss.item()
        tokens += int(batch.completion_mask.sum())
    return loss_total, kl_total if reference is not None else None, tokens


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


if __name__ == "__main__":
    cli(NashConfig, main, __doc__)
