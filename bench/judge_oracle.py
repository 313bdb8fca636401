"""The oracle test of the judge models: train the reward model, the process reward model and the value critic on
oracle-labelled gridworld rows from training tasks, and hold each against the hidden oracle on the environment's
held-out evaluation tasks, beside trivial baselines. Prints a table and writes the figures as JSON (`--out`).

    .venv/bin/python bench/judge_oracle.py                      # all three judges, ~6 min on 2 idle CPU cores
    .venv/bin/python bench/judge_oracle.py --models rm --pairs 1000 --rm '{"num_epochs": 6}'
    .venv/bin/python bench/judge_oracle.py --models rm --rm_layout full      # the export layout: ~10x slower
    .venv/bin/python bench/judge_oracle.py --base_model var/policies/bootstrap   # any HF directory as the base

The defaults (3,000 pairs, 3 epochs, a 2-layer Llama of width 64 built from config, the `decisions` layout) are the
smallest settings found that meet the judges' bar on a CPU: beat "shorter trajectory wins" overall and be clearly
above chance on pairs where both trajectories failed. With ~1,000 pairs the reward model is at 0.5-0.63 on those.

Training data (`simulation.oracle_data`): scripted episodes on training seeds, mixed noise levels. Pairs are
labelled by a B-Pref scripted teacher (P(a > b) = sigmoid(beta * (R_a - R_b)) on the oracle's `progress_return`,
then flipped with probability `epsilon`); step labels are the oracle's step correctness flipped with probability
`step_epsilon`, plus RLIF intervention rows on other episodes; the value critic gets the environment's rewards.

Evaluation: episodes on `GridWorld().eval_seeds()` (tasks no training row comes from), labelled by the oracle with
no noise. Pairs whose oracle returns are equal are left out (no answer is right).

- Reward model: pairwise accuracy overall and by pair type (both_succeeded / one_succeeded / both_failed), with a
  95 % interval from resampling whole tasks, beside "random" (0.5), "shorter trajectory wins" (steps; equal
  lengths count half), "nearer at the end wins" (the smaller distance the last decision's reasoning states) and
  "shorter, then nearer" (the two heuristics together). Each trajectory is scored once; a pair is right when the
  oracle's better trajectory has the higher reward.
- Process reward model: first-error accuracy and bad-step F1 against the oracle's step correctness (see
  `reward_models.prm.evaluate`), beside "never an error", "the first step is wrong", the training labels' most
  common first error, the majority label, "every step is bad" and "the action goes where the reasoning says the
  goal is" (blind to walls).
- Value critic: explained variance of the discounted returns on held-out steps, beside the per-step-index mean.

`--rm_layout decisions` shows the reward model only the first and the last observation and every decision (the
observations in between are emptied, turns kept): a long trajectory becomes ~250 tokens instead of ~1,000. Each
decision's reasoning states the offset to the goal, so little is lost, and the reward model trains 6-10x faster on
a CPU. The export layout is ``full``; the bench hands ``--rm_layout`` to the reward pipeline's ``layout`` setting,
which also offers ``actions`` and ``moves`` (no reasoning; see ``reward_models.policy.turns``). A conversation
ends, as an exported trajectory's does, with the observation the last action led to, which the ``decisions`` and
``moves`` layouts keep as their last observation.

The pipelines run as Tandem runs them (`main(config)`, artifact written, loaded again with the loader) with
``eval_fraction=0``: the held-out figures come from this script, not from a split of the training rows. Everything
runs on the CPU unless CUDA is there; ``--threads`` sets torch's CPU threads (1 is fastest when other work
shares a few cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the judge_oracle_* modules beside it
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from judge_oracle_judges import (  # noqa: E402
    PRM_DEFAULTS,
    RM_DEFAULTS,
    VALUE_DEFAULTS,
    base_model_dir,
    run_prm,
    run_reward_model,
    run_value,
)
from judge_oracle_metrics import judged_pairs  # noqa: E402

from reward_models.envs.gridworld import GridWorld  # noqa: E402
from reward_models.policy.turns import JUDGE_LAYOUTS  # noqa: E402
from simulation.episodes import PAIR_TYPES, scripted_episodes  # noqa: E402
from simulation.oracle_data import intervention_rows, preference_rows, returns_rows, stepwise_rows  # noqa: E402

MODELS = ("rm", "prm", "value")
LAYOUTS = JUDGE_LAYOUTS


# --- data --------------------------------------------------------------------------------------------------------


def training_data(args: argparse.Namespace) -> dict[str, Any]:
    """Episodes on training seeds: enough tasks for `args.pairs` teacher-labelled pairs (whole tasks, then cut to
    the count), and the episodes of the step-label, intervention and returns rows."""
    noises = tuple(args.noises)
    per_pair_task = math.comb(args.per_task, 2)
    n_tasks = max(1, math.ceil(args.pairs / per_pair_task * 1.3))
    while True:
        episodes = scripted_episodes(n_tasks, args.per_task, noises, seed=args.seed)
        rows = preference_rows(episodes, beta=args.beta, epsilon=args.epsilon, seed=args.seed)
        if len(rows) >= args.pairs:
            break
        n_tasks *= 2
    rows = rows[: args.pairs]
    used_tasks = {row["task_id"] for row in rows}
    step_episodes = episodes[: args.step_trajectories]
    intervention_episodes = episodes[args.step_trajectories : args.step_trajectories + args.intervention_trajectories]
    if len(step_episodes) + len(intervention_episodes) < args.step_trajectories + args.intervention_trajectories:
        raise SystemExit("--step_trajectories + --intervention_trajectories exceed the training episodes; add --pairs")
    teacher: dict[str, list[bool]] = {}
    for row in rows:
        teacher.setdefault(row["pair_type"], []).append(row["oracle_preferred"])
        teacher.setdefault("all", []).append(row["oracle_preferred"])
    return {
        "episodes": episodes,
        "preference": rows,
        "stepwise": stepwise_rows(step_episodes, epsilon=args.step_epsilon, seed=args.seed)
        + intervention_rows(intervention_episodes),
        "returns": returns_rows(episodes[: args.return_trajectories]),
        "stats": {
            "pair_tasks": len(used_tasks),
            "pairs": len(rows),
            "pairs_by_type": {name: len(teacher.get(name, [])) for name in PAIR_TYPES},
            "teacher_accuracy": {name: statistics.fmean(values) for name, values in teacher.items()},
            "step_trajectories": len(step_episodes),
            "intervention_trajectories": sum(episode.first_error is not None for episode in intervention_episodes),
            "return_trajectories": min(len(episodes), args.return_trajectories),
            "success_share": statistics.fmean(episode.success for episode in episodes),
        },
    }


# --- the report ------------------------------------------------------------------------------------------------------


def print_table(result: dict[str, Any]) -> None:
    stats = result["training_data"]
    teacher = stats["teacher_accuracy"]
    by_type = ", ".join(f"{name} {stats['pairs_by_type'][name]}" for name in PAIR_TYPES)
    agreement = ", ".join(f"{name} {teacher.get(name, math.nan):.3f}" for name in PAIR_TYPES)
    print(
        f"training: {stats['pairs']} pairs on {stats['pair_tasks']} tasks ({by_type}); the teacher agrees with "
        f"the oracle on {teacher['all']:.3f} ({agreement})"
    )
    held = result["held_out"]
    print(f"held out: {held['episodes']} episodes on {held['tasks']} eval tasks, {held['pairs']} judged pairs")
    if "rm" in result:
        rm = result["rm"]
        print(f"\nreward model ({rm['layout']} layout): pairwise accuracy against the oracle [95% task interval]")
        columns = ("all", *PAIR_TYPES)
        print(f"{'':26}" + "".join(f"{name:>22}" for name in columns))
        rows = [*rm["accuracy"].items(), ("reward_model - shorter", rm["minus_shorter_wins"])]
        for name, figures in rows:
            signed = "+" if name.endswith("shorter") else ""
            print(f"{name:26}" + "".join(_cell(figures[kind], signed) for kind in columns))
        print(f"{'pairs':26}" + "".join(f"{rm['accuracy']['random'][k]['pairs']:>22}" for k in ("all", *PAIR_TYPES)))
    if "prm" in result:
        m = result["prm"]["metrics"]
        print("\nprocess reward model against the oracle's step correctness")
        print(
            f"  first-error accuracy {m['first_error_accuracy']:.3f}   baselines: never an error "
            f"{m['baseline_never_first_error_accuracy']:.3f}, first step wrong "
            f"{m['baseline_first_step_first_error_accuracy']:.3f}, most common in training "
            f"{m['baseline_common_first_error_accuracy']:.3f}, action follows the reasoning "
            f"{m['baseline_follows_reasoning_first_error_accuracy']:.3f}"
        )
        print(
            f"  bad-step F1 {m['bad_step_f1']:.3f} (precision {m['bad_step_precision']:.3f}, recall "
            f"{m['bad_step_recall']:.3f}), AUROC {m['bad_step_auroc']:.3f}   baselines: every step bad "
            f"{m['baseline_all_bad_step_f1']:.3f}, majority label {m['baseline_majority_bad_step_f1']:.3f}, action "
            f"follows the reasoning {m['baseline_follows_reasoning_bad_step_f1']:.3f}"
        )
        print(
            f"  step accuracy {m['step_accuracy']:.3f}   majority label {m['baseline_majority_step_accuracy']:.3f}"
            f"   ({m['held_out_steps']} steps, {m['bad_step_share']:.3f} bad)"
        )
    if "value" in result:
        m = result["value"]["metrics"]
        print("\nvalue critic: discounted returns on held-out steps")
        print(
            f"  explained variance {m.get('explained_variance', float('nan')):.3f} (mse {m['mse']:.4f})   "
            f"per-step-index mean {m.get('baseline_step_mean_explained_variance', float('nan')):.3f} "
            f"(mse {m['baseline_step_mean_mse']:.4f})"
        )
    print("\nspeed (samples/s: pairs for the reward model, trajectory windows for the others)")
    for name in MODELS:
        if name in result:
            r = result[name]
            print(
                f"  {name:6} {r['samples_per_second']:8.2f} samples/s  train {r['train_seconds']:6.1f}s  "
                f"run {r['train_wall_seconds']:6.1f}s  held-out scoring {r['eval_seconds']:5.1f}s"
            )
    print(f"  wall time {result['wall_seconds']:.1f}s, load average at the end {result['machine']['load_average']}")


def _cell(figures: dict[str, Any], signed: str) -> str:
    if not figures["pairs"]:
        return "-".rjust(22)
    text = f"{figures['accuracy']:{signed}.3f} [{figures['low']:{signed}.2f},{figures['high']:{signed}.2f}]"
    return text.rjust(22)


# --- main --------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="var/bench/judge_oracle.json", help="Where the figures go (JSON).")
    parser.add_argument("--work_dir", default="", help="Keep data and models here (default: a temporary folder).")
    parser.add_argument("--models", default=",".join(MODELS), help="Comma-separated: rm, prm, value.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--device", default=None, help="Scoring device (default: CUDA if there is one).")
    group = parser.add_argument_group("base model")
    group.add_argument("--base_model", default="", help="A HF model directory; default: build a tiny Llama.")
    group.add_argument("--hidden_size", type=int, default=64, help="Width of the built Llama.")
    group.add_argument("--num_layers", type=int, default=2, help="Its decoder layers.")
    group.add_argument("--num_heads", type=int, default=4, help="Its attention heads.")
    group.add_argument("--intermediate_size", type=int, default=128, help="Its MLP width.")
    group = parser.add_argument_group("training data (training seeds, noisy teacher)")
    group.add_argument("--pairs", type=int, default=3000, help="Teacher-labelled pairs for the reward model.")
    group.add_argument("--per_task", type=int, default=4, help="Episodes per training task (pairs within tasks).")
    group.add_argument("--noises", type=float, nargs="+", default=[0.1, 0.4, 0.8], help="Demonstrator noise mix.")
    group.add_argument("--beta", type=float, default=50.0, help="Teacher rationality (<= 0: perfectly rational).")
    group.add_argument("--epsilon", type=float, default=0.1, help="Teacher's mistake rate on pairs.")
    group.add_argument("--step_epsilon", type=float, default=0.1, help="Mistake rate of the step labels.")
    group.add_argument("--step_trajectories", type=int, default=400, help="Step-labelled episodes for the PRM.")
    group.add_argument("--intervention_trajectories", type=int, default=200, help="Episodes with an intervention.")
    group.add_argument("--return_trajectories", type=int, default=400, help="Episodes for the value critic.")
    group = parser.add_argument_group("held-out evaluation (eval seeds, oracle labels)")
    group.add_argument("--eval_tasks", type=int, default=200, help="Eval seeds used (the environment has 200).")
    group.add_argument("--eval_per_task", type=int, default=6, help="Episodes per eval task.")
    group.add_argument("--step_eval_episodes", type=int, default=400, help="Of them, scored by the PRM and critic.")
    group = parser.add_argument_group("pipelines (JSON objects over the defaults, any field of their configs)")
    group.add_argument("--rm", default="{}", help=f"RewardConfig fields; defaults {RM_DEFAULTS}.")
    group.add_argument("--rm_layout", choices=LAYOUTS, default="decisions", help="What the reward model reads.")
    group.add_argument("--prm", default="{}", help=f"PRMConfig fields; defaults {PRM_DEFAULTS}.")
    group.add_argument("--value", default="{}", help=f"ValueConfig fields; defaults {VALUE_DEFAULTS}.")
    args = parser.parse_args(argv)
    args.models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"--models: unknown {sorted(unknown)}; choose from {', '.join(MODELS)}")
    if args.beta <= 0:
        args.beta = None
    for name in ("rm", "prm", "value"):
        try:
            overrides = json.loads(getattr(args, name))
        except json.JSONDecodeError as exc:
            parser.error(f"--{name}: not JSON ({exc.msg})")
        if not isinstance(overrides, dict):
            parser.error(f"--{name}: must be a JSON object")
    if not args.base_model and args.hidden_size % args.num_heads:
        parser.error("--hidden_size must be divisible by --num_heads")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from transformers.utils import logging as transformers_logging

    torch.set_num_threads(args.threads)
    # The load reports (a new head on a base model is expected here) and progress bars would bury the table.
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    started = time.perf_counter()
    env = GridWorld()
    data = training_data(args)
    evaluation = scripted_episodes(
        args.eval_tasks, args.eval_per_task, tuple(args.noises), seed=args.seed + 1, seeds=env.eval_seeds()
    )
    pairs = judged_pairs(evaluation)
    result: dict[str, Any] = {
        "settings": {
            key: value for key, value in vars(args).items() if key not in ("rm", "prm", "value", "out", "work_dir")
        },
        "training_data": data["stats"],
        "held_out": {
            "tasks": len({episode.task_id for episode in evaluation}),
            "episodes": len(evaluation),
            "pairs": len(pairs),
            "success_share": statistics.fmean(episode.success for episode in evaluation),
        },
    }
    with tempfile.TemporaryDirectory(prefix="judge-oracle-") as scratch:
        work = Path(args.work_dir or scratch)
        work.mkdir(parents=True, exist_ok=True)
        for name in ("rm", "prm", "value"):
            if (work / name).exists():
                raise SystemExit(f"{work / name} exists: give a fresh --work_dir (the pipelines would reuse it)")
        base = base_model_dir(args, work)
        # Per-step judges read every observation, so they are scored on an even spread of the held-out episodes.
        stride = max(1, len(evaluation) // args.step_eval_episodes)
        step_evaluation = evaluation[::stride][: args.step_eval_episodes]
        runners = {"rm": run_reward_model, "prm": run_prm, "value": run_value}
        for name in args.models:
            result[name] = runners[name](args, data, evaluation if name == "rm" else step_evaluation, base, work)
    result["wall_seconds"] = time.perf_counter() - started
    result["machine"] = {"threads": args.threads, "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
