"""Policy fine-tuning, measured: every trainer in `reward_models.finetune` starts from the same bootstrapped tiny
gridworld policy, learns from oracle-labelled feedback on its own rollouts (training tasks only), and is evaluated on
the 200 held-out tasks with greedy and with sampled decoding. Prints, per algorithm, the base and the new success
rate with standard errors, the gain with its paired standard error (same tasks, same seeds), the wall time and the
number of labels used, and PPO on the environment's true reward, meant as an upper bound (it is sparse, success at
the end only, and at these settings PPO on the reward model and PRM did better). Writes the figures as JSON
(`--out`).

    .venv/bin/python bench/policy_bench.py                           # everything: about 1.5 hours on 2 CPU cores
    .venv/bin/python bench/policy_bench.py --methods dpo,nash_md,ppo,ppo_oracle   # about 55 minutes
    .venv/bin/python bench/policy_bench.py --methods dpo,sft,kto     # the offline trainers only
    .venv/bin/python bench/policy_bench.py --policy var/policies/bootstrap --work_dir var/bench/policy

What the simulated annotators give (`reward_models.oracle_data`), all on the base policy's own sampled rollouts of
`--tasks` training tasks, two per task:
- interventions: on one rollout per task, an annotator who corrects the first wrong step with a shortest-path move
  and the demonstrator's reasoning; DPO learns from (correction ≻ original) step pairs, SFT imitates the
  corrections;
- ratings: a thumb per rollout (up for a success), flipped with probability `--epsilon`: KTO;
- comparisons: the two rollouts of a task, labelled by a B-Pref teacher (Bradley-Terry on the oracle's progress
  return, mistakes at `--epsilon`): the reward model (PPO) and the pairwise preference model (Nash-MD, SPO);
- step labels: the oracle's step correctness, flipped with probability `--epsilon`: the PRM (PPO).

Held-out success is measured once for the base policy and once per trained policy, by the same
`finetune.common.evaluate_policy` with the same seeds (sampled: `--eval_samples` episodes per task); the standard
error is over tasks. Every trainer runs through its `main(config)` exactly as a Tandem run does, with its dataclass
defaults unless `--settings` overrides them.
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

from reward_models import oracle_data  # noqa: E402
from reward_models.common import SilentReporter, config_from_dict  # noqa: E402

METHODS = ("sft", "dpo", "kto", "ppo", "nash_md", "spo", "ppo_oracle")
# Each method: its trainer module and config class, the file it learns from, and the judge models it needs.
TRAINERS: dict[str, tuple[str, str, str, dict[str, str], dict[str, Any]]] = {
    "sft": ("reward_models.finetune.sft", "SFTConfig", "sft.jsonl", {}, {}),
    "dpo": ("reward_models.finetune.dpo", "DPOConfig", "step_preference.jsonl", {}, {"level": "step"}),
    "kto": ("reward_models.finetune.kto", "KTOConfig", "unpaired.jsonl", {}, {}),
    "ppo": ("reward_models.finetune.ppo", "PPOConfig", "", {"reward_model_path": "rm", "prm_path": "prm"}, {}),
    "nash_md": (
        "reward_models.finetune.nash",
        "NashConfig",
        "",
        {"preference_model_path": "pm"},
        {"method": "nash_md"},
    ),
    "spo": ("reward_models.finetune.nash", "NashConfig", "", {"preference_model_path": "pm"}, {"method": "spo"}),
    "ppo_oracle": ("reward_models.finetune.ppo", "PPOConfig", "", {}, {"reward_source": "oracle"}),
}
# Which label files each judge model counts as "labels used".
JUDGE_DATA = {"rm": "preference.jsonl", "prm": "stepwise.jsonl", "pm": "preference.jsonl"}


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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads.")
    parser.add_argument(
        "--settings", default="{}", help='Per-method config overrides as JSON, e.g. {"dpo": {"beta": 1.0}}.'
    )
    parser.add_argument("--fresh", action="store_true", help="Train again what the work dir already holds.")
    args = parser.parse_args(argv)
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; the methods are {', '.join(METHODS)}")
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


def make_data(args: argparse.Namespace, policy_path: Path, data: Path) -> dict[str, int]:
    """The label files, from the base policy's own rollouts on training tasks; row counts by file."""
    counts_file = data / "counts.json"
    if counts_file.is_file() and not args.fresh:
        return json.loads(counts_file.read_text())
    from reward_models.finetune.common import load_policy_model
    from reward_models.policy.local import LocalCausalLMPolicy

    loaded = load_policy_model(policy_path)
    policy = LocalCausalLMPolicy.from_model(
        loaded.model,
        loaded.tokenizer,
        history_window=loaded.settings["history_window"],
        max_new_tokens=loaded.settings["max_new_tokens"],
    )
    started = time.monotonic()
    episodes = oracle_data.policy_episodes(policy, args.tasks, samples_per_task=2, greedy=False, seed=args.seed)
    print(f"{len(episodes)} rollouts of the base policy in {time.monotonic() - started:.0f} s", flush=True)
    first = episodes[::2]  # one rollout per task gets an intervention, a thumb and step labels
    files = {
        "step_preference.jsonl": oracle_data.intervention_step_preference_rows(first, seed=args.seed),
        "sft.jsonl": oracle_data.intervention_sft_rows(first, seed=args.seed),
        "unpaired.jsonl": oracle_data.unpaired_rows(first, epsilon=args.epsilon, seed=args.seed),
        "preference.jsonl": oracle_data.preference_rows(episodes, epsilon=args.epsilon, seed=args.seed),
        "stepwise.jsonl": oracle_data.stepwise_rows(first, epsilon=args.epsilon, seed=args.seed),
    }
    data.mkdir(parents=True, exist_ok=True)
    counts = {name: len(rows) for name, rows in files.items()}
    for name, rows in files.items():
        oracle_data.write_jsonl(rows, data / name)
    counts_file.write_text(json.dumps(counts, indent=1) + "\n")
    return counts


def train_judges(wanted: set[str], data: Path, judges: Path) -> dict[str, float]:
    """The reward model, PRM and preference model the online methods need, each from a tiny Llama whose word
    tokenizer covers the transcripts (as bench/judge_oracle.py trains them); wall seconds by judge."""
    from reward_models.finetune.preference_model import PreferenceModelConfig
    from reward_models.finetune.preference_model import main as train_pm
    from reward_models.prm import PRMConfig
    from reward_models.prm import main as train_prm
    from reward_models.reward import RewardConfig
    from reward_models.reward import main as train_rm

    recipes = {
        "rm": (RewardConfig, train_rm, {"data_path": str(data / JUDGE_DATA["rm"])}),
        "prm": (PRMConfig, train_prm, {"data_path": str(data / JUDGE_DATA["prm"]), "learning_rate": 5e-3}),
        "pm": (PreferenceModelConfig, train_pm, {"data_path": str(data / JUDGE_DATA["pm"])}),
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
    name: str, args: argparse.Namespace, policy_path: Path, work: Path, counts: dict[str, int], overrides: dict
) -> dict[str, Any]:
    import importlib

    from reward_models.finetune.common import evaluate_policy, load_policy_model

    module_name, class_name, data_file, judge_settings, implied = TRAINERS[name]
    module = importlib.import_module(module_name)
    output_dir = work / "policies" / name
    values: dict[str, Any] = {
        "policy_path": str(policy_path),
        "output_dir": str(output_dir),
        "seed": args.seed,
        "eval_tasks": 0,  # the bench evaluates every policy the same way below
        **implied,
        **{setting: str(work / "judges" / judge) for setting, judge in judge_settings.items()},
        **overrides,
    }
    if data_file:
        values["data_path"] = str(work / "data" / data_file)
    config = config_from_dict(getattr(module, class_name), values)
    if args.fresh:
        import shutil

        shutil.rmtree(output_dir, ignore_errors=True)
    started = time.monotonic()
    summary = module.main(config, SilentReporter())
    wall = time.monotonic() - started
    loaded = load_policy_model(output_dir)
    figures = evaluate_policy(
        loaded.model, loaded.tokenizer, loaded.settings, _eval_config(args, policy_path), per_task=True
    )
    # Offline trainers say how many rows they used (DPO's balancing keeps a subset); online ones used their judges'.
    judge_files = {JUDGE_DATA[judge] for judge in judge_settings.values()}
    labels = sum(counts[name] for name in judge_files) if judge_files else summary.get("labels_used") or 0
    return {"method": name, "labels": labels, "wall_seconds": wall, "final": figures, "settings": values}


def _eval_config(args: argparse.Namespace, policy_path: Path):
    from reward_models.finetune.common import PolicyTrainConfig

    return PolicyTrainConfig(
        policy_path=str(policy_path), output_dir="unused", eval_tasks=args.eval_tasks, eval_samples=args.eval_samples
    )


def _headline(metrics: dict[str, Any]) -> str:
    shown = [f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, float)][:3]
    return ", ".join(shown) or "trained"


def main(argv: list[str] | None = None) -> None:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    methods = args.methods.split(",")
    overrides = json.loads(args.settings)
    policy_path = base_policy(args, work)
    counts = make_data(args, policy_path, work / "data")
    print("labels: " + ", ".join(f"{name} {n}" for name, n in counts.items()), flush=True)

    from reward_models.finetune.common import evaluate_policy, load_policy_model

    loaded = load_policy_model(policy_path)
    base = evaluate_policy(
        loaded.model, loaded.tokenizer, loaded.settings, _eval_config(args, policy_path), per_task=True
    )
    print(f"base: greedy {_rate(base, 'greedy')}, sampled {_rate(base, 'sampled')}", flush=True)

    needed = {judge for name in methods for judge in TRAINERS[name][3].values()}
    missing = {judge for judge in needed if args.fresh or not (work / "judges" / judge).is_dir()}
    judge_seconds = train_judges(missing, work / "data", work / "judges")

    results = []
    for name in methods:
        print(f"training {name} ...", flush=True)
        result = run_method(name, args, policy_path, work, counts, overrides.get(name, {}))
        results.append(result)
        final = result["final"]
        print(f"  {name}: greedy {_rate(final, 'greedy')}, sampled {_rate(final, 'sampled')}", flush=True)

    print()
    print("Gains are paired: the same held-out tasks and seeds for the base and the new policy; ± one standard error.")
    print("| Algorithm | Labels used | Greedy: base → new | gain | Sampled: base → new | gain | Wall time |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        final = result["final"]
        result["gains"] = {mode: _paired_gain(base, final, mode) for mode in ("greedy", "sampled")}
        print(
            f"| {result['method']} | {result['labels']:,} | {_rate(base, 'greedy')} → {_rate(final, 'greedy')} | "
            f"{_gain(result['gains']['greedy'])} | {_rate(base, 'sampled')} → {_rate(final, 'sampled')} | "
            f"{_gain(result['gains']['sampled'])} | {result['wall_seconds']:.0f} s |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = {"base": base, "results": results, "judge_seconds": judge_seconds, "counts": counts}
    out.write_text(json.dumps(figures, indent=1, default=str))
    print(f"\nfigures in {out}")


def _paired_gain(base: dict[str, Any], final: dict[str, Any], mode: str) -> tuple[float, float]:
    from reward_models.rollout import paired_difference

    return paired_difference(base[f"{mode}_per_task"], final[f"{mode}_per_task"])


def _gain(gain: tuple[float, float]) -> str:
    return f"{100 * gain[0]:+.1f} ± {100 * gain[1]:.1f}"


def _rate(figures: dict[str, float], mode: str) -> str:
    return f"{100 * figures[f'{mode}_success']:.1f} ± {100 * figures[f'{mode}_stderr']:.1f} %"


if __name__ == "__main__":
    main()
