"""Several runs of bench/loop.py, one JSON a seed, read together: each seed's gains and their mean over the seeds.

    .venv/bin/python bench/loop.py --seed 1 --out var/bench/loop-s1.json   # ... one run a seed
    .venv/bin/python bench/loop_seeds.py var/bench/loop-s*.json

One run's gain is uncertain by about ±3.5 points on 200 held-out tasks, and its ratio to the oracle's gain runs wild
where the oracle gained little, so the bars are read on the means over the seeds: each case's mean final gain with
its standard error across seeds, the random and the active case's mean as a share of the oracle's (over the seeds
that ran both), and each round's mean gain, the curve on which the labels active needs for random's final gain are
read. Active's final gain minus random's is also taken seed by seed: run with `--active_comparisons` half of
`--comparisons`, that is the second bar at equal policy training. Files of one seed are merged case by case (a later
file's case wins), so a seed's oracle case may come from another run on the same base policy; cases of one seed on
different base policies are refused.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CASES = ("oracle", "random", "active")
DECODINGS = ("sampled", "greedy")


@dataclass
class Seed:
    seed: int
    base: dict[str, float]
    cases: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # case -> its rounds' points

    def gains(self, case: str, decoding: str) -> list[float]:
        """The case's gain over the base after each round."""
        return [point[decoding] - self.base[decoding] for point in self.cases[case]]


def load(paths: list[Path]) -> list[Seed]:
    seeds: dict[int, Seed] = {}
    for path in paths:
        try:
            run = json.loads(path.read_text())
            seed_number = int(run["settings"]["seed"])
            cases = run["cases"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}: not a bench/loop.py figures file ({exc})") from exc
        for case, figures in cases.items():
            try:
                base = {decoding: float(figures["base"][f"{decoding}_success"]) for decoding in DECODINGS}
                points = list(figures["points"])
            except (KeyError, TypeError, ValueError) as exc:
                raise SystemExit(f"{path}: the {case} case has no base policy figures or rounds ({exc!r})") from exc
            seed = seeds.setdefault(seed_number, Seed(seed_number, base))
            if not all(math.isclose(base[d], seed.base[d]) for d in DECODINGS):
                raise SystemExit(
                    f"{path}: seed {seed_number}'s {case} case started from a base policy at {base}, another file's "
                    f"case of that seed from {seed.base}: not the same base policy"
                )
            if not points:
                raise SystemExit(f"{path}: the {case} case has no rounds")
            seed.cases[case] = points
    return [seeds[number] for number in sorted(seeds)]


def mean_and_stderr(values: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error across seeds (None with one value)."""
    stderr = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return statistics.fmean(values), stderr


def summarise(seeds: list[Seed]) -> dict[str, Any]:
    cases = [case for case in CASES if any(case in seed.cases for seed in seeds)]
    summary: dict[str, Any] = {"seeds": [seed.seed for seed in seeds], "cases": {}}
    for case in cases:
        ran = [seed for seed in seeds if case in seed.cases]
        schedules = {tuple(point["comparisons"] for point in seed.cases[case]) for seed in ran}
        if len(schedules) > 1:
            raise SystemExit(f"the {case} case labelled on different schedules across seeds: {sorted(schedules)}")
        entry: dict[str, Any] = {"seeds": [seed.seed for seed in ran], "comparisons": list(schedules.pop())}
        for decoding in DECODINGS:
            curves = [seed.gains(case, decoding) for seed in ran]
            finals = [curve[-1] for curve in curves]
            per_round = [statistics.fmean(round_gains) for round_gains in zip(*curves, strict=True)]
            mean, stderr = mean_and_stderr(finals)
            entry[decoding] = {"final_gains": finals, "mean": mean, "stderr": stderr, "mean_per_round": per_round}
        last = [seed.cases[case][-1].get("judges", {}) for seed in ran]
        accuracies = [judges["rm_oracle_accuracy"] for judges in last if judges.get("rm_oracle_accuracy") is not None]
        if accuracies:
            entry["rm_last_round"] = statistics.fmean(accuracies)
        last_by_type = [judges.get("rm_oracle_accuracy_by_type") for judges in last]
        known = [shares for shares in last_by_type if shares]
        if known:
            entry["rm_last_round_by_type"] = {
                name: statistics.fmean(shares[name] for shares in known if name in shares)
                for name in dict.fromkeys(name for shares in known for name in shares)
            }
        summary["cases"][case] = entry
    if "oracle" in summary["cases"]:
        for case in ("random", "active"):
            if case in summary["cases"]:
                both = [seed for seed in seeds if case in seed.cases and "oracle" in seed.cases]
                if not both:
                    continue  # no seed ran this case and the oracle: no share to give
                for decoding in DECODINGS:
                    oracle = statistics.fmean(seed.gains("oracle", decoding)[-1] for seed in both)
                    own = statistics.fmean(seed.gains(case, decoding)[-1] for seed in both)
                    summary["cases"][case][decoding]["share_of_oracle"] = own / oracle if oracle > 0 else None
    if "random" in summary["cases"] and "active" in summary["cases"]:
        summary["labels_for_random_mean_gain"] = {
            decoding: labels_for_random_gain(summary["cases"], decoding) for decoding in DECODINGS
        }
        summary["active_minus_random"] = active_minus_random(seeds, summary["cases"])
    return summary


def active_minus_random(seeds: list[Seed], cases: dict[str, Any]) -> dict[str, Any]:
    """Active's final gain minus random's, seed by seed (the seeds that ran both), with its mean and standard error
    across those seeds. With `--active_comparisons` half of `--comparisons`, both cases trained the policy for the
    same rounds and iterations and active had half the labels: the second bar at equal training, which the mean
    curves cannot give (there, fewer labels also means fewer rounds of policy updates)."""
    both = [seed for seed in seeds if "random" in seed.cases and "active" in seed.cases]
    result: dict[str, Any] = {
        "seeds": [seed.seed for seed in both],
        "comparisons": {case: cases[case]["comparisons"][-1] for case in ("active", "random")},
    }
    for decoding in DECODINGS:
        differences = [seed.gains("active", decoding)[-1] - seed.gains("random", decoding)[-1] for seed in both]
        mean, stderr = mean_and_stderr(differences) if differences else (None, None)
        result[decoding] = {"differences": differences, "mean": mean, "stderr": stderr}
    return result


def labels_for_random_gain(cases: dict[str, Any], decoding: str) -> dict[str, int | None]:
    """On the mean curves: the fewest comparisons after which each case's mean gain reached random's final mean
    (None for both where random gained nothing: there is no gain to match)."""
    target = cases["random"][decoding]["mean_per_round"][-1]
    if target <= 0:
        return {"random": None, "active": None}
    reached = {}
    for case in ("random", "active"):
        curve = zip(cases[case]["comparisons"], cases[case][decoding]["mean_per_round"], strict=True)
        reached[case] = next((comparisons for comparisons, gain in curve if gain >= target), None)
    return reached


def _points(value: float) -> str:
    return f"{value * 100:+.1f}"


def _with_spread(value: float, stderr: float | None) -> str:
    """`+5.0 ± 3.5` in points; the value alone where there is no standard error."""
    return _points(value) + (f" ± {stderr * 100:.1f}" if stderr is not None else "")


def report(seeds: list[Seed], summary: dict[str, Any]) -> None:
    cases = list(summary["cases"])
    print("Change in held-out success after the last round, sampled / greedy (points, ± paired standard error)")
    header = f"{'seed':>4}  {'base (sampled / greedy)':>23}" + "".join(f"  {case:>25}" for case in cases)
    print(header)
    print("-" * len(header))
    for seed in seeds:
        cells = []
        for case in cases:
            if case not in seed.cases:
                cells.append(f"{'—':>25}")
                continue
            last = seed.cases[case][-1]
            texts = [
                _with_spread(seed.gains(case, d)[-1], last.get("gains", {}).get(f"{d}_gain_stderr")) for d in DECODINGS
            ]
            cells.append(f"{' / '.join(texts):>25}")
        base = f"{seed.base['sampled']:.1%} / {seed.base['greedy']:.1%}"
        print(f"{seed.seed:>4}  {base:>23}" + "".join(f"  {cell}" for cell in cells))
    means = []
    for case in cases:
        figures = summary["cases"][case]
        texts = [_with_spread(figures[d]["mean"], figures[d]["stderr"]) for d in DECODINGS]
        means.append(f"{' / '.join(texts):>25}")
    print(f"{'mean':>4}  {'(± across seeds)':>23}" + "".join(f"  {cell}" for cell in means))
    print()
    for case in ("random", "active"):
        figures = summary["cases"].get(case)
        if figures and "share_of_oracle" in figures["sampled"]:
            shares = ", ".join(
                f"{d} {figures[d]['share_of_oracle']:.0%}"
                if figures[d]["share_of_oracle"] is not None
                else f"{d}: the oracle gained nothing"
                for d in DECODINGS
            )
            print(f"{case}: mean gain as a share of the oracle's mean gain: {shares}")
    print()
    print("Mean gain after each round (points), sampled / greedy")
    for case in cases:
        figures = summary["cases"][case]
        # The oracle case labels nothing: its rounds are named by number.
        labels = (
            figures["comparisons"]
            if any(figures["comparisons"])
            else [f"round {number}" for number in range(1, len(figures["comparisons"]) + 1)]
        )
        rounds = ", ".join(
            f"{label}: {_points(s)} / {_points(g)}"
            for label, s, g in zip(
                labels,
                figures["sampled"]["mean_per_round"],
                figures["greedy"]["mean_per_round"],
                strict=True,
            )
        )
        print(f"  {case} (seeds {', '.join(map(str, figures['seeds']))}): {rounds}")
    for decoding, reached in summary.get("labels_for_random_mean_gain", {}).items():
        target = summary["cases"]["random"][decoding]["mean_per_round"][-1]
        if target <= 0:
            print(f"{decoding}: random's mean gain is {_points(target)}, so there is no gain to match")
            continue
        active = reached["active"] if reached["active"] is not None else "not reached"
        print(
            f"{decoding}: comparisons for random's final mean gain ({_points(target)}): random {reached['random']}, "
            f"active {active}"
        )
    difference = summary.get("active_minus_random")
    if difference and difference["seeds"]:
        texts = " / ".join(_with_spread(difference[d]["mean"], difference[d]["stderr"]) for d in DECODINGS)
        print(
            f"active's final gain ({difference['comparisons']['active']} comparisons) minus random's "
            f"({difference['comparisons']['random']}), seed by seed, mean over seeds "
            f"{', '.join(map(str, difference['seeds']))}: {texts} (sampled / greedy)"
        )
    for case in ("random", "active"):
        figures = summary["cases"].get(case, {})
        shares = {"all": figures["rm_last_round"]} if "rm_last_round" in figures else {}
        shares |= figures.get("rm_last_round_by_type") or {}
        if shares:
            text = ", ".join(f"{name.replace('_', ' ')} {share:.1%}" for name, share in shares.items())
            print(f"{case}: reward model on the oracle pairs after the last round, mean over seeds: {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figures", nargs="+", type=Path, help="bench/loop.py's --out files, one or more a seed.")
    parser.add_argument("--out", type=Path, help="Also write the summary here as JSON.")
    args = parser.parse_args(argv)
    seeds = load(args.figures)
    summary = summarise(seeds)
    report(seeds, summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2))
        print(f"summary: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
