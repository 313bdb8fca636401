"""Policy fine-tuning, measured as a fair race: every trainer in `reward_models.finetune` starts from the same
bootstrapped tiny gridworld policy, learns from oracle-labelled feedback on that policy's own rollouts (training tasks
only) with the same label noise, and is evaluated on the 200 held-out tasks with greedy and with sampled decoding,
over several seeds. Prints, per method, the base and the new success rate, the gain with its paired standard error,
the spread of the gain over seeds, the wall time and the number of annotator actions the method's labels took; and
PPO on the environment's true reward, meant as an upper bound (it is sparse, success at the end only). Writes the
figures as JSON (`--out`).

    .venv/bin/python bench/policy_bench.py                            # every method, 3 seeds: several CPU hours
    .venv/bin/python bench/policy_bench.py --methods dpo,sft,kto      # the offline trainers only
    .venv/bin/python bench/policy_bench.py --seeds 0 --methods ppo,ppo_oracle

The race is fair in three ways:
- **The same noise.** Every simulated annotator errs with probability `--epsilon`: an intervention's correction is a
  wrong move, a thumb or a step label is flipped, a comparison goes the wrong way.
- **No checkpoint selection.** Every method's result is its last policy (PPO's selection on training tasks is off),
  so no method gets extra evaluations of the environment's true success.
- **One unit of labels: annotator actions.** A comparison, a thumb, an intervention (one written correction) and a
  step label are one action each; an online method counts the actions behind its judge models.

What the simulated annotators give (`simulation.oracle_data`), all on the base policy's own sampled rollouts of
`--tasks` training tasks, two per task:
- interventions: on one rollout per task, an annotator who corrects the first wrong step with a shortest-path move
  and the demonstrator's reasoning: step DPO learns from (correction > original) pairs, SFT imitates the corrections;
- ratings: a thumb per rollout (up for a success): KTO;
- comparisons: the two rollouts of a task, labelled by a B-Pref teacher (Bradley-Terry on the oracle's progress
  return): the reward model (PPO), the pairwise preference model (Nash-MD, SPO) and trajectory DPO;
- step labels: the oracle's step correctness: the PRM (PPO);
- first-decision comparisons of `--tasks` training tasks (an optimal first move against another, and against an
  answer the environment cannot parse): the single-turn reward model of GRPO.

Each seed draws its own rollouts, labels, judge models and training; the base policy and its evaluation are shared.
Held-out success is measured by the same `finetune.evaluation.evaluate_policy` with the same seeds for the base and
every trained policy (sampled: `--eval_samples` episodes per task). A method's gain is paired: per held-out task, its
success averaged over the seeds minus the base's, with the standard error over tasks; the seed spread is the
standard error of the per-seed gains. Every trainer runs through its `main(config)` exactly as a Tandem run does,
with its dataclass defaults unless `--settings` overrides them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from reward_models.common.config import config_from_dict  # noqa: E402
from reward_models.common.reporting import SilentReporter  # noqa: E402
from simulation import oracle_data  # noqa: E402
from simulation.episodes import policy_episodes  # noqa: E402

METHODS = ("sft", "dpo", "dpo_trajectory", "kto", "ppo", "nash_md", "spo", "grpo", "ppo_oracle")
# Each method: its trainer module, its config class (as module.Class under reward_models.finetune), the file it learns
# from, and the judge models it needs.
TRAINERS: dict[str, tuple[str, str, str, dict[str, str], dict[str, Any]]] = {
    "sft": ("reward_models.finetune.sft", "sft.SFTConfig", "sft.jsonl", {}, {}),
    "dpo": ("reward_models.finetune.dpo", "dpo.DPOConfig", "step_preference.jsonl", {}, {"level": "step"}),
    "dpo_trajectory": (
        "reward_models.finetune.dpo",
        "dpo.DPOConfig",
        "preference.jsonl",
        {},
        {"level": "trajectory"},
    ),
    "kto": ("reward_models.finetune.kto", "kto.KTOConfig", "unpaired.jsonl", {}, {}),
    "ppo": (
        "reward_models.finetune.ppo",
        "ppo_config.PPOConfig",
        "",
        {"reward_model_path": "rm", "prm_path": "prm"},
        {"selection_tasks": 0},
    ),
    "nash_md": (
        "reward_models.finetune.nash",
        "nash.NashConfig",
        "",
        {"preference_model_path": "pm"},
        {"method": "nash_md"},
    ),
    "spo": ("reward_models.finetune.nash", "nash.NashConfig", "", {"preference_model_path": "pm"}, {"method": "spo"}),
    "grpo": ("reward_models.finetune.grpo", "grpo.GRPOConfig", "", {"reward_model_path": "rm_first"}, {}),
    "ppo_oracle": (
        "reward_models.finetune.ppo",
        "ppo_config.PPOConfig",
        "",
        {},
        {"reward_source": "oracle", "selection_tasks": 0},
    ),
}
# The label file each judge model learns from.
JUDGE_DATA = {
    "rm": "preference.jsonl",
    "prm": "stepwise.jsonl",
    "pm": "preference.jsonl",
    "rm_first": "first_step_preference.jsonl",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS), help="Comma-separated, of: " + ", ".join(METHODS))
    parser.add_argument("--policy", default="", help="The base policy directory (default: bootstrap one, seed 0).")
    parser.add_argument("--work_dir", default="var/bench/policy", help="Data, judge models and trained policies.")
    parser.add_argument("--out", default="var/bench/policy_bench.json", help="Where the figures go (JSON).")
    # 600 tasks (about 520 comparisons) left the reward and preference models near chance on held-out pairs and
    # PPO and Nash-MD no better than the base; 1,200 is the smallest size at which every method was measured to help.
    parser.add_argument("--tasks", type=int, default=1200, help="Training tasks the base policy plays (2 each).")
    parser.add_argument("--epsilon", type=float, default=0.1, help="The simulated annotators' mistake rate.")
    parser.add_argument("--eval_tasks", type=int, default=200, help="Held-out tasks (the environment has 200).")
    parser.add_argument(
        "--eval_samples", type=int, default=4, help="Sampled episodes per held-out task (greedy: one, deterministic)."
    )
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds (at least 3 for the spread).")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads.")
    parser.add_argument(
        "--settings", default="{}", help='Per-method config overrides as JSON, e.g. {"dpo": {"beta": 1.0}}.'
    )
    parser.add_argument("--fresh", action="store_true", help="Train again what the work dir already holds.")
    args = parser.parse_args(argv)
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; the methods are {', '.join(METHODS)}")
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    return args


def base_policy(args: argparse.Namespace, work: Path) -> Path:
    if args.policy:
        return Path(args.policy)
    path = work / "bootstrap"
    if not (path / "config.json").is_file():
        from reward_models.policy.bootstrap import BootstrapConfig
        from reward_models.policy.bootstrap import main as bootstrap

        print(f"bootstrapping the base policy into {path} (2-3 minutes)", flush=True)
        bootstrap(BootstrapConfig(output_dir=str(path), seed=0, max_seconds=1800.0))
    return path


def make_data(args: argparse.Namespace, policy_path: Path, data: Path, seed: int) -> dict[str, int]:
    """The label files of one seed, from the base policy's own rollouts on training tasks; annotator actions by
    file (`actions`)."""
    counts_file = data / "counts.json"
    if counts_file.is_file() and not args.fresh:
        return json.loads(counts_file.read_text())
    from reward_models.finetune.policy_model import load_policy_model
    from reward_models.policy.local import LocalCausalLMPolicy

    loaded = load_policy_model(policy_path)
    policy = LocalCausalLMPolicy.from_model(
        loaded.model,
        loaded.tokenizer,
        history_window=loaded.settings["history_window"],
        max_new_tokens=loaded.settings["max_new_tokens"],
    )
    started = time.monotonic()
    episodes = policy_episodes(policy, args.tasks, samples_per_task=2, greedy=False, seed=seed)
    print(
        f"seed {seed}: {len(episodes)} rollouts of the base policy in {time.monotonic() - started:.0f} s", flush=True
    )
    from reward_models.finetune.grpo import first_step_preference_rows

    first = episodes[::2]  # one rollout per task gets an intervention, a thumb and step labels
    noise = {"epsilon": args.epsilon, "seed": seed}
    files = {
        "step_preference.jsonl": oracle_data.intervention_step_preference_rows(first, **noise),
        "sft.jsonl": oracle_data.intervention_sft_rows(first, **noise),
        "unpaired.jsonl": oracle_data.unpaired_rows(first, **noise),
        "preference.jsonl": oracle_data.preference_rows(episodes, **noise),
        "stepwise.jsonl": oracle_data.stepwise_rows(first, **noise),
        "first_step_preference.jsonl": first_step_preference_rows(
            args.tasks, pairs_per_task=1, malformed_per_task=1, **noise
        ),
    }
    data.mkdir(parents=True, exist_ok=True)
    counts = {name: annotator_actions(name, rows) for name, rows in files.items()}
    for name, rows in files.items():
        oracle_data.write_jsonl(rows, data / name)
    counts_file.write_text(json.dumps(counts, indent=1) + "\n")
    return counts


def annotator_actions(name: str, rows: list[dict[str, Any]]) -> int:
    """How many annotator actions a label file took: one per row (a comparison, a thumb, an intervention), except
    step labels, one per labelled step. The SFT rows are the interventions again, so they are counted as such."""
    if name == "stepwise.jsonl":
        return sum(len(row["labels"]) for row in rows)
    return len(rows)


def train_judges(wanted: set[str], data: Path, judges: Path) -> dict[str, float]:
    """The reward model, PRM and preference model the online methods need, each from a tiny Llama whose word
    tokenizer covers the transcripts (as bench/judge_oracle.py trains them); wall seconds by judge."""
    from reward_models.finetune.preference_model import PreferenceModelConfig
    from reward_models.finetune.preference_model import main as train_pm
    from reward_models.prm import PRMConfig
    from reward_models.prm import main as train_prm
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.train import main as train_rm

    recipes = {
        "rm": (RewardConfig, train_rm, {"data_path": str(data / JUDGE_DATA["rm"])}),
        "prm": (PRMConfig, train_prm, {"data_path": str(data / JUDGE_DATA["prm"]), "learning_rate": 5e-3}),
        "pm": (PreferenceModelConfig, train_pm, {"data_path": str(data / JUDGE_DATA["pm"])}),
        "rm_first": (RewardConfig, train_rm, {"data_path": str(data / JUDGE_DATA["rm_first"])}),
    }
    seconds: dict[str, float] = {}
    if not wanted:
        return seconds
    base = oracle_data.build_tiny_base(
        judges / "base", hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128
    )
    for name in sorted(wanted):
        config_class, train, values = recipes[name]
        values = {"base_model": str(base), "output_dir": str(judges / name), "eval_fraction": 0.1, **values}
        started = time.monotonic()
        summary = train(config_from_dict(config_class, values), SilentReporter())
        seconds[name] = time.monotonic() - started
        print(f"judge {name}: {_headline(summary.get('metrics') or {})} ({seconds[name]:.0f} s)", flush=True)
    return seconds


def run_method(
    name: str,
    args: argparse.Namespace,
    policy_path: Path,
    work: Path,
    seed: int,
    counts: dict[str, int],
    overrides: dict,
) -> dict[str, Any]:
    """Train one method on one seed's labels and judges (in `work`), and evaluate its last policy."""
    import importlib

    from reward_models.finetune.evaluation import evaluate_policy
    from reward_models.finetune.policy_model import load_policy_model

    module_name, class_name, data_file, judge_settings, implied = TRAINERS[name]
    module = importlib.import_module(module_name)
    output_dir = work / "policies" / name
    values: dict[str, Any] = {
        "policy_path": str(policy_path),
        "output_dir": str(output_dir),
        "seed": seed,
        "eval_tasks": 0,  # the bench evaluates every policy the same way below
        **implied,
        **{setting: str(work / "judges" / judge) for setting, judge in judge_settings.items()},
        **overrides,
    }
    if data_file:
        values["data_path"] = str(work / "data" / data_file)
    config_module, _, config_class = class_name.rpartition(".")
    config_type = getattr(importlib.import_module(f"reward_models.finetune.{config_module}"), config_class)
    config = config_from_dict(config_type, values)
    if args.fresh:
        import shutil

        shutil.rmtree(output_dir, ignore_errors=True)
    started = time.monotonic()
    module.main(config, SilentReporter())
    wall = time.monotonic() - started
    loaded = load_policy_model(output_dir)
    figures = evaluate_policy(
        loaded.model, loaded.tokenizer, loaded.settings, _eval_config(args, policy_path), per_task=True
    )
    files = {JUDGE_DATA[judge] for judge in judge_settings.values()} | ({data_file} if data_file else set())
    actions = sum(counts[file] for file in files)
    return {"method": name, "seed": seed, "actions": actions, "wall_seconds": wall, "final": figures}


def _eval_config(args: argparse.Namespace, policy_path: Path):
    from reward_models.finetune.config import PolicyTrainConfig

    return PolicyTrainConfig(
        policy_path=str(policy_path), output_dir="unused", eval_tasks=args.eval_tasks, eval_samples=args.eval_samples
    )


def _headline(metrics: dict[str, Any]) -> str:
    shown = [f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, float)][:3]
    return ", ".join(shown) or "trained"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    methods = args.methods.split(",")
    overrides = json.loads(args.settings)
    policy_path = base_policy(args, work)

    from reward_models.finetune.evaluation import evaluate_policy
    from reward_models.finetune.policy_model import load_policy_model

    loaded = load_policy_model(policy_path)
    base = evaluate_policy(
        loaded.model, loaded.tokenizer, loaded.settings, _eval_config(args, policy_path), per_task=True
    )
    print(f"base: greedy {_rate(base, 'greedy')}, sampled {_rate(base, 'sampled')}", flush=True)

    runs: list[dict[str, Any]] = []
    judge_seconds: dict[int, dict[str, float]] = {}
    counts_by_seed: dict[int, dict[str, int]] = {}
    for seed in args.seeds:
        seed_work = work / f"seed-{seed}"
        counts = make_data(args, policy_path, seed_work / "data", seed)
        counts_by_seed[seed] = counts
        print(f"seed {seed}, annotator actions: " + ", ".join(f"{n} {c}" for n, c in counts.items()), flush=True)
        needed = {judge for name in methods for judge in TRAINERS[name][3].values()}
        missing = {judge for judge in needed if args.fresh or not (seed_work / "judges" / judge).is_dir()}
        judge_seconds[seed] = train_judges(missing, seed_work / "data", seed_work / "judges")
        for name in methods:
            print(f"seed {seed}: training {name} ...", flush=True)
            run = run_method(name, args, policy_path, seed_work, seed, counts, overrides.get(name, {}))
            runs.append(run)
            final = run["final"]
            print(f"  {name}: greedy {_rate(final, 'greedy')}, sampled {_rate(final, 'sampled')}", flush=True)

    results = [summarise(name, [run for run in runs if run["method"] == name], base) for name in methods]
    print()
    print(
        f"{len(args.seeds)} seeds. A gain is paired: per held-out task, the success averaged over the seeds minus the "
        "base's (same tasks, same evaluation seeds), ± its standard error over tasks; the seed spread is the standard "
        "error of the per-seed gains. Annotator actions: per seed."
    )
    print(
        "| Method | Annotator actions | Greedy → | gain | seed spread | Sampled → | gain | seed spread | Wall time |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        cells = [result["method"], f"{result['actions']:,}"]
        for mode in ("greedy", "sampled"):
            gain = result["gains"][mode]
            cells += [
                f"{100 * result['success'][mode]:.1f} %",
                _gain(gain["paired"]),
                f"± {100 * gain['seed_se']:.1f}",
            ]
        cells.append(f"{result['wall_seconds']:.0f} s")
        print("| " + " | ".join(cells) + " |")
    print(f"| *base* | | {_rate(base, 'greedy')} | | | {_rate(base, 'sampled')} | | | |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = {
        "seeds": args.seeds,
        "epsilon": args.epsilon,
        "tasks": args.tasks,
        "base": base,
        "results": results,
        "runs": runs,
        "judge_seconds": judge_seconds,
        "actions": counts_by_seed,
        "settings": overrides,
    }
    out.write_text(json.dumps(figures, indent=1, default=str))
    print(f"\nfigures in {out}")
    return figures


def summarise(name: str, runs: list[dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    """One method over its seeds: mean success, the paired gain of the seed-averaged per-task success over the
    base's, the standard error of the per-seed gains, mean annotator actions and wall time."""
    from reward_models.rollout import mean_and_stderr

    summary: dict[str, Any] = {
        "method": name,
        "seeds": [run["seed"] for run in runs],
        "actions": round(sum(run["actions"] for run in runs) / len(runs)),
        "wall_seconds": sum(run["wall_seconds"] for run in runs) / len(runs),
        "success": {},
        "gains": {},
    }
    for mode in ("greedy", "sampled"):
        per_task = [run["final"][f"{mode}_per_task"] for run in runs]
        averaged = [sum(values) / len(values) for values in zip(*per_task, strict=True)]
        per_seed = [_paired_gain(base, run["final"], mode)[0] for run in runs]
        summary["success"][mode] = sum(averaged) / len(averaged)
        summary["gains"][mode] = {
            "paired": _paired_gain(base, {f"{mode}_per_task": averaged}, mode),
            "per_seed": per_seed,
            "seed_se": mean_and_stderr(per_seed)[1] if len(per_seed) > 1 else float("nan"),
        }
    return summary


def _paired_gain(base: dict[str, Any], final: dict[str, Any], mode: str) -> tuple[float, float]:
    from reward_models.rollout import paired_difference

    return paired_difference(base[f"{mode}_per_task"], final[f"{mode}_per_task"])


def _gain(gain: tuple[float, float]) -> str:
    return f"{100 * gain[0]:+.1f} ± {100 * gain[1]:.1f}"


def _rate(figures: dict[str, float], mode: str) -> str:
    return f"{100 * figures[f'{mode}_success']:.1f} ± {100 * figures[f'{mode}_stderr']:.1f} %"


if __name__ == "__main__":
    main()
