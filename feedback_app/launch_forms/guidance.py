"""The launch form's guidance before a launch: settings that suit the built-in tiny models, and a rough run time
for the settings the form holds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from feedback_app.launch_forms.forms import RunForm
from feedback_app.models import RunKind

# Settings the project's own benchmarks found to work for the built-in tiny models (a Llama of width 64 to 128 built
# from config), where a trainer's defaults suit pretrained models: bench/judge_oracle.py's recipes, and the reward
# model's `moves` layout from bench/loop.py (a judge that reads the policy's reasoning can be gamed through it).
TINY_RECIPES: dict[str, dict[str, str]] = {
    RunKind.REWARD_MODEL: {"config.learning_rate": "0.001", "config.num_epochs": "3", "config.layout": "moves"},
    RunKind.PRM: {"config.learning_rate": "0.005", "config.num_epochs": "5", "config.batch_size": "8"},
    RunKind.VALUE_CRITIC: {"config.learning_rate": "0.002", "config.num_epochs": "5", "config.batch_size": "8"},
}

# Rough costs on 2 CPU cores with the built-in tiny policy. A held-out evaluation of 200 tasks, a greedy and a sampled
# episode each, took 90 s: about 0.22 s an episode. DPO made 100 optimiser steps of 16 pairs in 2-3 minutes: about
# 0.1 s an example. The judge pipelines learn 8 to 19 examples a second (bench/train_bench.py).
EPISODE_SECONDS = 0.22
POLICY_EXAMPLE_SECONDS = 0.1
JUDGE_EXAMPLE_SECONDS = 0.1


def estimate(form: RunForm, values: Mapping[str, str], rows: int | None) -> list[tuple[str, float]]:
    """A rough run time in parts, each `(what, seconds)`, for the form's settings (`values`, as posted; a value that
    does not parse counts as its default) on a snapshot of `rows` rows (None: not known yet)."""
    setting = _setting_values(form, values)
    if form.family == "rollout":
        episodes = setting["num_tasks"] * setting["samples_per_task"]
        return [(f"rolling out {episodes} episodes", episodes * EPISODE_SECONDS)]
    if form.family == "judge":
        if rows is None:
            return []
        steps = setting["max_steps"]
        epochs = setting["num_epochs"] if steps < 0 else steps * setting["batch_size"] / max(rows, 1)
        examples = epochs * rows * setting.get("ensemble_size", 1)
        return [(f"training on {round(examples)} examples", examples * JUDGE_EXAMPLE_SECONDS)]
    parts = []
    evaluations = 2 if setting["eval_base"] else 1
    episodes = setting["eval_tasks"] * (1 + setting["eval_samples"]) * evaluations
    if episodes:
        whose = "the base and the trained policy" if evaluations == 2 else "the trained policy"
        parts.append((f"evaluating {whose} on {episodes} held-out episodes", episodes * EPISODE_SECONDS))
    if form.export_kinds:
        steps = setting["max_steps"]
        if rows is not None:
            steps = min(steps, math.ceil(setting.get("num_epochs", 1) * rows / setting["batch_size"]))
        parts.append((f"{steps} optimiser steps", steps * setting["batch_size"] * POLICY_EXAMPLE_SECONDS))
    else:
        rollouts = setting["max_steps"] * setting.get("rollouts_per_step", setting["batch_size"])
        seconds = rollouts * (EPISODE_SECONDS + POLICY_EXAMPLE_SECONDS)
        parts.append((f"{setting['max_steps']} iterations of rollouts and updates ({rollouts} episodes)", seconds))
    return parts


def _setting_values(form: RunForm, values: Mapping[str, str]) -> dict[str, Any]:
    parsed = {}
    for setting in form.settings:
        try:
            parsed[setting.name] = setting.parse(values[f"config.{setting.name}"])
        except (KeyError, ValueError):
            parsed[setting.name] = setting.default
    if parsed.get("batch_size", 1) < 1:  # a bad value the launch will refuse; the estimate still reads
        parsed["batch_size"] = next(s.default for s in form.settings if s.name == "batch_size")
    return parsed
