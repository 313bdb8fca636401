"""The report of bench/loop.py: the table of every case's rounds and the verdict (each case's gain over the
base policy, its share of the oracle's, the labels active queries need for random's gain, and the reward models
against the oracle pairs)."""

from __future__ import annotations

import argparse
from typing import Any

from loop_oracle_pairs import by_type_text
from loop_rounds import Point


def gain(points: list[Point], base: dict[str, Any], decoding: str) -> float:
    return getattr(points[-1], decoding) - base.get(f"{decoding}_success", float("nan"))


def gain_stderr(points: list[Point], decoding: str) -> float:
    """The last round's gain's paired standard error (nan when the runs did not keep each task's success)."""
    return points[-1].gains.get(f"{decoding}_gain_stderr", float("nan"))


def labels_to_reach(points: list[Point], base: dict[str, Any], decoding: str, target: float) -> int | None:
    """The fewest comparisons after which the case's gain reached `target`; None when it never did."""
    for point in points:
        if getattr(point, decoding) - base.get(f"{decoding}_success", float("nan")) >= target:
            return point.comparisons
    return None


def report(results: dict[str, tuple[dict[str, Any], list[Point]]], args: argparse.Namespace) -> dict[str, Any]:
    base = next(iter(results.values()))[0]
    print()
    print(
        f"Base policy: greedy {base.get('greedy_success', float('nan')):.1%}, sampled "
        f"{base.get('sampled_success', float('nan')):.1%} on {args.eval_tasks} held-out tasks (sampled: "
        f"{args.eval_samples} episodes of each)"
    )
    header = f"{'case':<8} {'round':>5} {'comparisons':>11} {'step items':>10} {'annotator min':>13}"
    header += f" {'greedy':>16} {'sampled':>16} {'RM vs oracle':>12} {'time':>6}"
    print(header)
    print("-" * len(header))
    for case, (_, points) in results.items():
        for p in points:
            print(
                f"{case:<8} {p.round:>5} {p.comparisons:>11} {p.step_items:>10} {p.annotator_minutes:>13.1f} "
                f"{p.greedy:>8.1%} ± {p.greedy_stderr:>4.1%} {p.sampled:>8.1%} ± {p.sampled_stderr:>4.1%} "
                f"{_percent(p.judges.get('rm_oracle_accuracy')):>12} {p.seconds:>5.0f}s"
            )
    verdict: dict[str, Any] = {}
    # The gains need only the cases that ran: the shares of the oracle's need the oracle case, active minus random
    # needs both query cases (`--cases random,active` gives that without the oracle's runs).
    if "oracle" in results or ("random" in results and "active" in results):
        print()
        for decoding in ("sampled", "greedy"):
            figures = verdict[decoding] = {}
            oracle_gain = None
            if "oracle" in results:
                oracle_gain = figures["oracle_gain"] = gain(results["oracle"][1], base, decoding)
                figures["oracle_gain_stderr"] = gain_stderr(results["oracle"][1], decoding)
            for case in ("random", "active"):
                if case in results:
                    case_gain = gain(results[case][1], base, decoding)
                    figures[f"{case}_gain"] = case_gain
                    figures[f"{case}_gain_stderr"] = gain_stderr(results[case][1], decoding)
                    if oracle_gain is not None:
                        figures[f"{case}_fraction_of_oracle"] = case_gain / oracle_gain if oracle_gain > 0 else None
            if "random" in results and "active" in results:
                figures["active_minus_random"] = figures["active_gain"] - figures["random_gain"]
                figures["labels_for_random_gain"] = {
                    case: labels_to_reach(results[case][1], base, decoding, figures["random_gain"])
                    for case in ("random", "active")
                }
            parts = []
            if oracle_gain is not None:
                parts.append(f"oracle gain {oracle_gain:+.1%} ± {figures['oracle_gain_stderr']:.1%}")
            for case in ("random", "active"):
                if f"{case}_gain" in figures:
                    text = f"{case} {figures[f'{case}_gain']:+.1%} ± {figures[f'{case}_gain_stderr']:.1%}"
                    if oracle_gain is not None:
                        fraction = figures[f"{case}_fraction_of_oracle"]
                        text += (
                            f" ({fraction:.0%} of the oracle's)"
                            if fraction is not None
                            else " (oracle gained nothing)"
                        )
                    parts.append(text)
            if "labels_for_random_gain" in figures and figures["random_gain"] <= 0:
                parts.append("random queries gained nothing, so there is no gain to match")
            elif "labels_for_random_gain" in figures:
                needed = figures["labels_for_random_gain"]
                parts.append(
                    f"comparisons to reach random's final gain: random {needed['random']}, active "
                    f"{needed['active'] if needed['active'] is not None else 'not reached'}"
                )
            if "active_minus_random" in figures:
                totals = {case: results[case][1][-1].comparisons for case in ("active", "random")}
                parts.append(
                    f"active ({totals['active']} comparisons) minus random ({totals['random']}): "
                    f"{figures['active_minus_random']:+.1%}"
                )
            print(f"{decoding}: " + "; ".join(parts))
    # Scored against the oracle pairs (the gridworld's only): every round of every case is, or none is.
    if "random" in results and "active" in results and "rm_oracle_accuracy" in results["random"][1][-1].judges:
        target = results["random"][1][-1].judges.get("rm_oracle_accuracy")
        reached = {
            case: next(
                (p.comparisons for p in results[case][1] if p.judges.get("rm_oracle_accuracy", 0) >= target), None
            )
            for case in ("random", "active")
        }
        verdict["reward_model"] = {
            case: [p.judges.get("rm_oracle_accuracy") for p in results[case][1]] for case in ("random", "active")
        } | {
            "comparisons_for_random_final_accuracy": reached,
            "by_pair_type": {
                case: [p.judges.get("rm_oracle_accuracy_by_type") for p in results[case][1]]
                for case in ("random", "active")
            },
        }
        finals = ", ".join(f"{case} {_percent(verdict['reward_model'][case][-1])}" for case in ("random", "active"))
        active = reached["active"] if reached["active"] is not None else "not reached"
        print(
            f"reward model against the oracle, last round: {finals}; comparisons to reach random's last accuracy: "
            f"random {reached['random']}, active {active}"
        )
        last_by_type = {case: verdict["reward_model"]["by_pair_type"][case][-1] or {} for case in ("random", "active")}
        print(
            "by pair type, last round: "
            + "; ".join(f"{case} {by_type_text(shares)}" for case, shares in last_by_type.items())
        )
    return verdict


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"
