"""The judges of bench/judge_oracle.py, trained and scored: the reward model, the process reward model and the
value critic, each run as Tandem runs its pipeline on the oracle-labelled training rows and then held against the
oracle on the held-out episodes, beside the baselines; and the tiny base model they start from."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from judge_oracle_metrics import BASELINES, follows_reasoning, judged_pairs, pair_accuracy, smaller_wins

from simulation.episodes import OracleEpisode
from simulation.oracle_data import returns_rows, stepwise_rows, write_jsonl

# Pipeline settings for a tiny model on a CPU; --rm / --prm / --value JSON overrides them.
RM_DEFAULTS: dict[str, Any] = {
    "num_epochs": 3.0,
    "learning_rate": 1e-3,
    "batch_size": 16,
    "max_length": 1024,
    "save_steps": 10_000,
    "logging_steps": 10,
}
PRM_DEFAULTS: dict[str, Any] = {
    "num_epochs": 5.0,
    "learning_rate": 5e-3,
    "batch_size": 8,
    "max_length": 1024,
    "save_steps": 10_000,
    "logging_steps": 10,
}
VALUE_DEFAULTS: dict[str, Any] = {**PRM_DEFAULTS, "learning_rate": 2e-3}


def base_model_dir(args: argparse.Namespace, work: Path) -> str:
    """`args.base_model`, or a freshly initialised tiny Llama with the gridworld word tokenizer (as the
    `tiny_base_model` test fixture builds it, sized by the flags)."""
    if args.base_model:
        return args.base_model
    from simulation.oracle_data import build_tiny_base

    path = build_tiny_base(
        work / "base",
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        intermediate_size=args.intermediate_size,
        seed=args.seed,
    )
    return str(path)


def train_judge(
    config_class: type,
    main: Any,
    values: dict[str, Any],
    rows: list[dict[str, Any]],
    data_file: str,
    base: str,
    output_dir: Path,
) -> tuple[Any, dict[str, Any], float]:
    """A judge's pipeline `main` run as Tandem runs it on `rows` (written to `data_file` beside `output_dir`) with
    the settings `values`, every row trained on (no held-out split: the bench holds out its own episodes). Returns
    the config, the run's summary and its wall-clock seconds."""
    from reward_models.common.config import config_from_dict

    path = write_jsonl(rows, output_dir.parent / data_file)
    config = config_from_dict(
        config_class,
        {**values, "data_path": str(path), "base_model": base, "output_dir": str(output_dir), "eval_fraction": 0.0},
    )
    started = time.perf_counter()
    summary = main(config)
    return config, summary, time.perf_counter() - started


def timings(summary: dict[str, Any], train_wall: float, eval_started: float) -> dict[str, float]:
    """A judge's speed figures: its summary's training throughput and seconds, the run's wall-clock seconds, and
    the seconds its evaluation took from `eval_started` (a `time.perf_counter` reading) until now."""
    return {
        "samples_per_second": summary["samples_per_second"],
        "train_seconds": summary["train_seconds"],
        "train_wall_seconds": train_wall,
        "eval_seconds": time.perf_counter() - eval_started,
    }


def run_reward_model(
    args: argparse.Namespace, data: dict[str, Any], evaluation: list[OracleEpisode], base: str, work: Path
) -> dict[str, Any]:
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.model import load_reward_model
    from reward_models.reward.train import main

    # The reward model lays out its training rows and whatever it scores itself.
    values = {**RM_DEFAULTS, "layout": args.rm_layout, "seed": args.seed, **json.loads(args.rm)}
    config, summary, train_wall = train_judge(
        RewardConfig, main, values, data["preference"], "preference.jsonl", base, work / "rm"
    )
    started = time.perf_counter()
    model = load_reward_model(config.output_dir, device=args.device)
    cuts = [len(episode.prompt) for episode in evaluation]
    scores, _ = model.score(
        [episode.messages[:cut] for episode, cut in zip(evaluation, cuts, strict=True)],
        [episode.messages[cut:] for episode, cut in zip(evaluation, cuts, strict=True)],
    )
    reward = {id(episode): score for episode, score in zip(evaluation, scores, strict=True)}
    pairs = judged_pairs(evaluation)

    def higher_reward_wins(better: OracleEpisode, worse: OracleEpisode) -> float:
        return smaller_wins(-reward[id(better)], -reward[id(worse)])

    figures = {"reward_model": pair_accuracy(pairs, higher_reward_wins)}
    figures.update({name: pair_accuracy(pairs, outcome) for name, outcome in BASELINES.items()})
    # The same pairs judged by both, so the interval of the difference is much narrower than either accuracy's.
    shorter_wins = BASELINES["shorter_wins"]
    margin_over_length = pair_accuracy(
        pairs, lambda better, worse: higher_reward_wins(better, worse) - shorter_wins(better, worse)
    )
    return {
        "config": {k: v for k, v in values.items()},
        "layout": args.rm_layout,
        "accuracy": figures,
        "minus_shorter_wins": margin_over_length,
        **timings(summary, train_wall, started),
        "train_pairs": summary["train_samples"],
    }


def trajectory_judge_figures(
    values: dict[str, Any], trained: tuple[Any, dict[str, Any], float], measure: Callable[[Any], dict[str, Any]]
) -> dict[str, Any]:
    """The figures of a trajectory-level judge (the PRM or the value critic) that `train_judge` trained with the
    settings `values` (`trained` is what it returned): `measure(config)` loads the judge and returns its held-out
    metrics, timed as its evaluation."""
    config, summary, train_wall = trained
    started = time.perf_counter()
    metrics = measure(config)
    return {
        "config": values,
        "metrics": metrics,
        **timings(summary, train_wall, started),
        "train_trajectories": summary["train_trajectories"],
    }


def run_prm(
    args: argparse.Namespace, data: dict[str, Any], evaluation: list[OracleEpisode], base: str, work: Path
) -> dict[str, Any]:
    from reward_models.prm import PRMConfig, evaluate, load_prm, main, step_metrics

    def measure(config: PRMConfig) -> dict[str, Any]:
        prm = load_prm(config.output_dir, device=args.device)
        rows = stepwise_rows(evaluation)  # no noise: the labels are the oracle's
        scores = prm.batch_step_scores([(row["prompt"], row["completions"]) for row in rows])
        labelled = [row for row in data["stepwise"] if row["source"] == "label"]
        metrics = evaluate(scores, rows, labelled, config.threshold)
        guesses = [
            [follows_reasoning(episode.conversation.assistant(step)["content"]) for step in range(len(row["labels"]))]
            for episode, row in zip(evaluation, rows, strict=True)
        ]
        heuristic = step_metrics(guesses, [row["labels"] for row in rows])
        metrics.update({f"baseline_follows_reasoning_{name}": value for name, value in heuristic.items()})
        return {name: value for name, value in metrics.items() if not name.startswith("oracle_")}

    values = {**PRM_DEFAULTS, "seed": args.seed, **json.loads(args.prm)}
    trained = train_judge(PRMConfig, main, values, data["stepwise"], "stepwise.jsonl", base, work / "prm")
    return trajectory_judge_figures(values, trained, measure)


def run_value(
    args: argparse.Namespace, data: dict[str, Any], evaluation: list[OracleEpisode], base: str, work: Path
) -> dict[str, Any]:
    from reward_models.value import ValueConfig, discounted_returns, evaluate, load_value_critic, main

    def measure(config: ValueConfig) -> dict[str, Any]:
        critic = load_value_critic(config.output_dir, device=args.device)
        rows = returns_rows(evaluation)
        predicted = critic.batch_values([(row["prompt"], row["completions"]) for row in rows])
        return evaluate(
            predicted,
            [discounted_returns(row["rewards"], config.gamma) for row in rows],
            [discounted_returns(row["rewards"], config.gamma) for row in data["returns"]],
        )

    values = {**VALUE_DEFAULTS, "seed": args.seed, **json.loads(args.value)}
    trained = train_judge(ValueConfig, main, values, data["returns"], "returns.jsonl", base, work / "value")
    return trajectory_judge_figures(values, trained, measure)
