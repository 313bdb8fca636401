"""Held-out evaluation of a policy under training: greedy and sampled success on the environment's evaluation
tasks, before and after training, and the gains between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reward_models.common.reporting import Reporter
from reward_models.finetune.config import PolicyTrainConfig, environment_factory
from reward_models.finetune.policy_model import playing_policy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    if not config.eval_tasks:
        return {}
    factory = environment_factory(config)
    seeds = list(factory().eval_seeds())[: config.eval_tasks]
    padding_side = tokenizer.padding_side  # generation pads on the left; trainers may pad on the right
    policy = playing_policy(model, tokenizer, settings, config)
    try:
        greedy, sampled = greedy_and_sampled(
            policy,
            factory,
            seeds,
            samples=config.eval_samples,
            temperature=config.eval_temperature,
            seed=seed,
            progress=lambda mode: _phase_progress(reporter, f"evaluating {whose}: {mode}"),
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


def greedy_and_sampled(
    policy: Any,
    factory: Callable,
    seeds: list[int],
    *,
    temperature: float,
    seed: int,
    samples: int = 1,
    progress: Callable[[str], Callable[[int, int], None] | None] = lambda mode: None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`rollout.evaluate_success` of `policy` on the tasks of `seeds`, played greedily and then sampled (`samples`
    episodes of each task at `temperature`); `progress(mode)` gives each mode's progress callback."""
    from reward_models.rollout import evaluate_success

    greedy = evaluate_success(policy, factory, seeds, greedy=True, seed=seed, progress=progress("greedy"))
    sampled = evaluate_success(
        policy,
        factory,
        seeds,
        greedy=False,
        samples=samples,
        temperature=temperature,
        seed=seed,
        progress=progress("sampled"),
    )
    return greedy, sampled


def _phase_progress(reporter: Reporter | None, phase: str) -> Callable[[int, int], None] | None:
    """A `rollout` progress callback that reports to `reporter` in `phase` (None without a reporter)."""
    if reporter is None:
        return None
    return lambda done, total: reporter.progress(done, total, phase)


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
