"""Which feedback buys the most policy per annotator-minute: comparisons, step labels, interventions, a mix, and the
oracle's reward, each spending the same simulated annotator time on the tool-calling shop, over several seeds.

    .venv/bin/python bench/feedback_types.py                      # the defaults: 3 seeds, 30, 60 and 120 minutes
    .venv/bin/python bench/feedback_types.py --seeds 0 --budgets 4,8 --tasks 12 --iterations 1 --eval_tasks 8 \\
        --eval_samples 1                                           # a short run (about 5 minutes)

The base policy is the careless tool agent (`simulation.careless_agent`, built once into `--work_dir`): it knows
every step of a difficulty-1 shop task and slips at temperature 1, so the feedback has something within its reach to
fix. `--env toolshop` starts from the shipped policy at difficulty 2 instead, whose failures are a missing skill.

Each seed runs in a process of its own, all at once (one after another when `--port` names a port), with a Tandem of
its own (a real web server and Celery worker on the embedded defaults, as `bench/loop.py` starts them); there each arm
is a project, with the same base policy and the same training and held-out tasks as every other arm of its seed (the
base policy is scored once a seed, in the oracle arm's first run). Per round, the current policy plays `--tasks`
training tasks × `--samples`; the rollout queues what the arm labels, the crowd of simulated annotators (B-Pref
teachers with their rationality and mistake rates) labels until the arm's annotator time, by the annotator-time model
(`feedback_app.annotator_time`, set with `--annotator_seconds`), reaches the round's budget; unlabelled items stay
queued for the next round. Then:

- comparisons: a reward-model ensemble on every comparison so far, then PPO on it;
- step_labels: first-error marks (PRM800K's shortcut: the steps before the first wrong one are good), a PRM on
  them, then PPO on the PRM alone (its signed shaping);
- interventions: the annotator marks the first wrong step and writes the corrected turn; step DPO on (correction >
  original) with an SFT term on the corrections;
- mix: half the time on comparisons, half on first-error marks; PPO on the reward model and the PRM;
- oracle: PPO on the environment's true reward for the same iterations, no labels (the upper bound).

`--budgets` are the cumulative annotator minutes at the end of each round. The policy's held-out success (greedy,
and sampled: `--eval_samples` episodes of each of `--eval_tasks` held-out tasks) is read from each round's policy run.
Gains are over the base policy, paired over the same held-out tasks; across seeds, the standard error of a mean gain
(or of a difference between two arms, paired by seed) is the larger of the spread of the seeds' figures and the
held-out tasks' own paired error. Prints the table, writes it as JSON (`--out`, with the plot's SVG for the docs page)
and plots held-out success against annotator minutes (`--plot`, PNG by Chromium, SVGs beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loop  # noqa: E402  (bench/loop.py: the servers, the set-up and the rounds)
from loop_plot import render_png  # noqa: E402

ROOT = loop.ROOT
DECODINGS = ("sampled", "greedy")
# Items queued per round over what the budget buys: the crowd stops at the budget, and the rest stay queued.
QUEUE_MARGIN = 1.5
# PPO's own default learning rate (5e-5, for pretrained models) leaves the tiny tool-shop policies where they are even
# on the true reward over nine iterations of 16 episodes. On the careless agent, 1e-4 and 3e-4 both take the true
# reward's sampled success from 39 % to 65-69 % in those nine; the lower one drifts less from the reference (per-turn
# KL about 0.5 against 0.5-1.3), and a KL charge of 0.05 holds a policy trained on learned judges nearer the
# rollouts those judges were trained on.
DEFAULT_SETTINGS = {"ppo": {"learning_rate": 1e-4, "kl_beta": 0.05}}
FIRST_ERROR = {"first_error_marks": True, "critiques": False, "interventions": False}


@dataclass(frozen=True)
class Arm:
    """What one arm labels, and how its policy learns from it."""

    # Shares of each round's annotator time queued as comparisons and as step items (single trajectories).
    comparison_share: float
    step_share: float
    # How each teacher answers a step item (TeacherConfig settings over the crowd's own).
    teacher: dict[str, Any] = field(default_factory=dict)
    # The judges trained each round: "reward_model", "prm".
    judges: tuple[str, ...] = ()
    # ppo (on the judges, or on the oracle's reward when there are none) or dpo (step DPO on the interventions).
    method: str = "ppo"


ARMS = {
    "comparisons": Arm(1.0, 0.0, judges=("reward_model",)),
    "step_labels": Arm(0.0, 1.0, FIRST_ERROR, judges=("prm",)),
    "interventions": Arm(0.0, 1.0, FIRST_ERROR | {"interventions": True}, method="dpo"),
    "mix": Arm(0.5, 0.5, FIRST_ERROR, judges=("reward_model", "prm")),
    "oracle": Arm(0.0, 0.0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--env",
        default="toolshop_careless",
        choices=sorted(loop.ENVIRONMENTS),
        help="The environment and base policy (default: %(default)s, the careless tool agent).",
    )
    parser.add_argument("--arms", default=",".join(ARMS), help="Comma-separated, of: " + ", ".join(ARMS))
    parser.add_argument(
        "--budgets", default="30,60,120", help="Cumulative annotator minutes at the end of each round."
    )
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds; each runs every arm.")
    parser.add_argument("--tasks", type=int, default=64, help="Fresh training tasks the policy plays per round.")
    parser.add_argument("--samples", type=int, default=3, help="Rollouts per task.")
    parser.add_argument("--ensemble", type=int, default=2, help="Reward-model ensemble members.")
    parser.add_argument("--iterations", type=int, default=3, help="PPO iterations per round.")
    parser.add_argument("--episodes", type=int, default=16, help="PPO episodes per iteration.")
    parser.add_argument("--eval_tasks", type=int, default=48, help="Held-out tasks scored per policy.")
    parser.add_argument("--eval_samples", type=int, default=2, help="Sampled episodes per held-out task.")
    parser.add_argument("--policy", default="", help="The base policy directory (default: the environment's).")
    parser.add_argument("--work_dir", default="var/bench/feedback_types", help="Data directories and base policy.")
    parser.add_argument("--out", default="var/bench/feedback_types.json", help="The figures as JSON.")
    parser.add_argument("--plot", default="var/bench/feedback_types.png", help="The plot (PNG; SVGs beside it).")
    parser.add_argument(
        "--settings",
        default=json.dumps(DEFAULT_SETTINGS),
        help='Run config overrides, JSON: {"ppo": {"kl_beta": 0.05}} (default: %(default)s).',
    )
    loop.add_crowd_and_server_arguments(parser)
    # Each seed runs in a process of its own (Django binds one process to one database): the bench starts itself
    # with one seed and this option, and reads back what that seed's arms did.
    parser.add_argument("--seed_json", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.arm_names = [name for name in args.arms.split(",") if name]
    unknown = sorted(set(args.arm_names) - set(ARMS))
    if unknown or not args.arm_names:
        parser.error(f"--arms: unknown {unknown}; the arms are {', '.join(ARMS)}")
    args.budget_minutes = _numbers(parser, "budgets", args.budgets, float)
    if any(b <= a for a, b in zip([0.0, *args.budget_minutes], args.budget_minutes, strict=False)):
        parser.error("--budgets: each must be larger than the one before, and the first positive")
    args.seed_list = _numbers(parser, "seeds", args.seeds, int)
    if len(set(args.seed_list)) != len(args.seed_list) or min(args.seed_list) < 0:
        parser.error("--seeds: distinct seeds, 0 or more")
    if args.seed_json and len(args.seed_list) != 1:
        parser.error("--seed_json: one seed at a time")
    for name in ("tasks", "ensemble", "iterations", "episodes", "eval_tasks", "eval_samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1")
    if args.samples < 2:
        parser.error("--samples: must be at least 2 (a comparison needs two rollouts of a task)")
    if args.parallel < 0:
        parser.error("--parallel: must be 0 (the default) or positive")
    try:
        args.settings = json.loads(args.settings)
    except json.JSONDecodeError as exc:
        parser.error(f"--settings: not JSON ({exc})")
    # What bench/loop.py's set-up and rounds read.
    args.rounds = len(args.budget_minutes)
    args.method = "ppo"
    return args


def _numbers(parser: argparse.ArgumentParser, name: str, text: str, kind: type) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--{name}: comma-separated numbers, not {text!r}")
    if not values:
        parser.error(f"--{name}: at least one")
    return values


# --- the rounds --------------------------------------------------------------------------------------------------


class ArmLoop(loop.Loop):
    """bench/loop.py's rounds, with each case an arm: what it queues and labels, its judges and its policy run."""

    def say(self, text: str) -> None:
        # The seeds run at once, so each line names its seed as well as its arm.
        print(f"[seed {self.args.seed} {getattr(self.local, 'case', '-')}] {text}", flush=True)

    def round_budget(self, round_: int) -> float:
        """The round's annotator seconds: its cumulative budget minus the last round's."""
        minutes = self.args.budget_minutes
        return 60 * (minutes[round_] - (minutes[round_ - 1] if round_ else 0.0))

    def labels(self, case: str) -> bool:
        return bool(ARMS[case].comparison_share or ARMS[case].step_share)

    def queued(self, case: str, round_: int) -> tuple[int, int]:
        """Comparisons and step items a round queues: half as many again as its budget buys at the model's times
        (a trajectory with no wrong step costs a label per step instead), at most what the rollout makes."""
        arm, seconds, times = ARMS[case], self.round_budget(round_), self.time_model
        item = times.first_error + (times.intervention_seconds() if arm.teacher.get("interventions") else 0.0)
        trajectories = self.args.tasks * self.args.samples
        pairs = self.args.tasks * self.args.samples * (self.args.samples - 1) // 2
        comparisons = math.ceil(QUEUE_MARGIN * arm.comparison_share * seconds / times.comparison)
        steps = math.ceil(QUEUE_MARGIN * arm.step_share * seconds / item)
        return min(comparisons, pairs), min(steps, trajectories)

    def rollout(self, project: int, policy: int, round_: int, case: str) -> dict[str, Any]:
        tasks = self.setup["projects"][case]["tasks"][round_ * self.args.tasks : (round_ + 1) * self.args.tasks]
        comparisons, steps = self.queued(case, round_)
        config = {
            "task_ids": tasks,
            "samples_per_task": self.args.samples,
            "seed": self.round_seed(round_),
            "queue_comparisons": comparisons,
            "queue_step_labels": steps,
        }
        return self.launch(project, {"kind": "rollout", "policy_version": policy, "config": config})["summary"]

    def label(self, project: int, case: str, round_: int, spent: float) -> dict[str, Any]:
        """Until the arm's labels reach the round's cumulative budget."""
        budget = 60 * self.args.budget_minutes[round_] - spent
        return self.run_crowd(project, ARMS[case].teacher, max(budget, 0.0))

    def judges(self, project: int, round_: int, case: str) -> dict[str, Any]:
        judges: dict[str, Any] = {}
        for kind in ARMS[case].judges:
            run = self.reward_model(project, round_) if kind == "reward_model" else self.prm(project, round_)
            judges[kind] = run["summary"]["registered_model"]
            judges[f"{kind}_seconds"] = run["summary"].get("train_seconds")
        return judges

    @property
    def base_arm(self) -> str:
        """The arm whose first policy run also scores the base policy: every arm of a seed starts from the same
        policy and is scored on the same held-out tasks with the same seed, so one scoring serves them all (the
        oracle's, which labels nothing and so finishes first)."""
        names = self.args.arm_names
        return "oracle" if "oracle" in names else names[0]

    def train_policy(
        self, project: int, policy: int, round_: int, judges: dict[str, Any] | None, case: str
    ) -> dict[str, Any]:
        arm = ARMS[case]
        body, config = self.policy_run(arm.method, policy, round_)
        config["eval_base"] = round_ == 0 and case == self.base_arm
        if arm.method == "dpo":
            body["snapshot"] = self.snapshot(project, "step_preference", f"step-preferences-r{round_}")
        elif not arm.judges:
            config["reward_source"] = "oracle"
        else:
            body["judges"] = {
                {"reward_model": "reward_model_path", "prm": "prm_path"}[kind]: judges[kind] for kind in arm.judges
            }
            if "reward_model" not in arm.judges:
                # The PRM alone: its signed shaping pays each good step and charges each bad one.
                config.update(prm_shaping="signed", prm_weight=1.0)
        body["config"] = {**config, **self.overrides(arm.method)}
        return self.launch(project, body)["summary"]


# --- the report ----------------------------------------------------------------------------------------------------


def per_task(point: dict[str, Any], decoding: str) -> list[float] | None:
    return (point.get("final") or {}).get(f"{decoding}_per_task")


def paired_stderr(per_seed: list[float], task_stderrs: list[float]) -> float | None:
    """A mean's standard error over seeds: the seeds' spread, or the held-out tasks' own paired error where that is
    larger (three seeds can agree by chance)."""
    spread = statistics.stdev(per_seed) / math.sqrt(len(per_seed)) if len(per_seed) > 1 else None
    tasks = math.sqrt(sum(s**2 for s in task_stderrs)) / len(task_stderrs) if task_stderrs else None
    known = [value for value in (spread, tasks) if value is not None and math.isfinite(value)]
    return max(known) if known else None


def summarise(runs: dict[int, dict[str, dict[str, Any]]], budgets: list[float]) -> dict[str, Any]:
    """Mean gains over the seeds at each budget, with standard errors; each pair of arms' difference, paired by seed
    and task; and the bars' verdicts. `runs[seed][arm]` is {"base": ..., "points": [Point dicts]}."""
    from reward_models.rollout import paired_difference

    seeds = sorted(runs)
    arms = list(dict.fromkeys(arm for seed in seeds for arm in runs[seed]))
    rows, table = [], {}
    for arm in arms:
        for index, minutes in enumerate(budgets):
            row: dict[str, Any] = {"arm": arm, "budget_minutes": minutes}
            points = [runs[seed][arm]["points"][index] for seed in seeds]
            row["annotator_minutes"] = statistics.fmean(p["annotator_minutes"] for p in points)
            row["comparisons"] = statistics.fmean(p["comparisons"] for p in points)
            row["step_items"] = statistics.fmean(p["step_items"] for p in points)
            row["interventions"] = statistics.fmean(p["interventions"] for p in points)
            for decoding in DECODINGS:
                gains = [p["gains"].get(f"{decoding}_gain", math.nan) for p in points]
                errors = [p["gains"][key] for p in points if (key := f"{decoding}_gain_stderr") in p["gains"]]
                row[f"{decoding}_success"] = statistics.fmean(p[decoding] for p in points)
                row[f"{decoding}_gain"] = statistics.fmean(gains)
                row[f"{decoding}_gain_stderr"] = paired_stderr(gains, errors)
            rows.append(row)
            table[arm, index] = row
    differences = []
    for a, b in combinations([arm for arm in arms if arm != "oracle"], 2):
        for index, minutes in enumerate(budgets):
            entry: dict[str, Any] = {"arms": f"{a} − {b}", "budget_minutes": minutes}
            for decoding in DECODINGS:
                per_seed, errors = [], []
                for seed in seeds:
                    first = runs[seed][a]["points"][index]
                    second = runs[seed][b]["points"][index]
                    per_seed.append(first[decoding] - second[decoding])
                    tasks_a, tasks_b = first.get("per_task", {}), second.get("per_task", {})
                    if tasks_a.get(decoding) and tasks_b.get(decoding):
                        errors.append(paired_difference(tasks_b[decoding], tasks_a[decoding])[1])
                entry[decoding] = statistics.fmean(per_seed)
                entry[f"{decoding}_stderr"] = paired_stderr(per_seed, errors)
                stderr = entry[f"{decoding}_stderr"]
                entry[f"{decoding}_in_stderrs"] = entry[decoding] / stderr if stderr else None
            differences.append(entry)
    return {"seeds": seeds, "table": rows, "differences": differences, "verdict": verdict(table, differences, arms)}


def verdict(table: dict, differences: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """The bars: the best label-learning arm's sampled gain at the last budget as a share of the oracle's; the arms
    whose gain is at least 2 standard errors; the pairs of arms more than 2 standard errors apart."""
    last = max(index for _, index in table)
    learners = [arm for arm in arms if arm != "oracle"]
    out: dict[str, Any] = {}
    if learners:
        best = max(learners, key=lambda arm: table[arm, last]["sampled_gain"])
        out["best_arm"] = best
        out["best_sampled_gain"] = table[best, last]["sampled_gain"]
        if "oracle" in arms:
            oracle = table["oracle", last]["sampled_gain"]
            out["oracle_sampled_gain"] = oracle
            out["best_share_of_oracle"] = out["best_sampled_gain"] / oracle if oracle > 0 else None
    out["arms_2_stderrs_over_base"] = sorted(
        {
            f"{arm} ({decoding}, {table[arm, index]['budget_minutes']:g} min)"
            for (arm, index), row in table.items()
            for decoding in DECODINGS
            if row[f"{decoding}_gain_stderr"] and row[f"{decoding}_gain"] >= 2 * row[f"{decoding}_gain_stderr"]
        }
    )
    out["pairs_over_2_stderrs"] = [
        f"{entry['arms']} ({decoding}, {entry['budget_minutes']:g} min): {entry[decoding]:+.1%}"
        for entry in differences
        for decoding in DECODINGS
        if entry[f"{decoding}_in_stderrs"] is not None and abs(entry[f"{decoding}_in_stderrs"]) > 2
    ]
    return out


def print_report(summary: dict[str, Any], base: dict[int, dict[str, Any]]) -> None:
    print()
    for seed, figures in base.items():
        print(
            f"seed {seed}: base policy greedy {figures.get('greedy_success', math.nan):.1%}, sampled "
            f"{figures.get('sampled_success', math.nan):.1%}"
        )
    header = f"{'arm':<14} {'budget':>6} {'minutes':>7} {'comp.':>5} {'items':>5} {'interv.':>7}"
    header += f" {'sampled gain':>17} {'greedy gain':>17}"
    print(header)
    print("-" * len(header))
    for row in summary["table"]:
        print(
            f"{row['arm']:<14} {row['budget_minutes']:>6g} {row['annotator_minutes']:>7.1f} "
            f"{row['comparisons']:>5.0f} {row['step_items']:>5.0f} {row['interventions']:>7.0f} "
            + " ".join(
                f"{row[f'{d}_gain']:>+8.1%} ± {_percent(row[f'{d}_gain_stderr']):>6}" for d in ("sampled", "greedy")
            )
        )
    print()
    for key, value in summary["verdict"].items():
        print(f"{key}: {value if not isinstance(value, float) else f'{value:.3f}'}")


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def chart(summary: dict[str, Any], decoding: str) -> str:
    """Mean held-out success against annotator minutes, one line per arm (the oracle's drawn at its budgets)."""
    from feedback_app.charts import line_chart

    series: dict[str, list[tuple[float, float]]] = {}
    for row in summary["table"]:
        x = row["budget_minutes"] if row["arm"] == "oracle" else row["annotator_minutes"]
        series.setdefault(row["arm"], [(0.0, 100 * (row[f"{decoding}_success"] - row[f"{decoding}_gain"]))])
        series[row["arm"]].append((x, 100 * row[f"{decoding}_success"]))
    return str(
        line_chart(
            series,
            title=f"Held-out success, {decoding} decoding (mean over seeds)",
            x_label="annotator minutes",
            y_label="success (%)",
            width=560,
            height=360,
        )
    )


# --- main ----------------------------------------------------------------------------------------------------------


def run_seed(args: argparse.Namespace, seed: int, policy_dir: Path, work: Path) -> dict[str, Any]:
    seeded = argparse.Namespace(**{**vars(args), "seed": seed})
    crowd = loop.crowd_members(args.crowd, seed)
    arms = ArmLoop(seeded, crowd, [])
    results = loop.run_cases(arms, args.arm_names, policy_dir, work / f"data-seed{seed}")
    base = results[arms.base_arm][0]
    return {
        arm: {"base": base, "points": [with_base(p, base) for p in points]} for arm, (_, points) in results.items()
    }


def with_base(point: loop.Point, base: dict[str, Any]) -> dict[str, Any]:
    """`point` as a dict, its gains paired with the seed's one scoring of the base policy."""
    from reward_models.finetune.evaluation import success_gain

    final = {f"{decoding}_success": getattr(point, decoding) for decoding in DECODINGS}
    final |= {f"{decoding}_per_task": tasks for decoding, tasks in point.per_task.items()}
    return asdict(point) | {"gains": success_gain({"base": base, "final": final})}


def seeds_in_own_processes(argv: list[str], seeds: list[int], work: Path, at_once: bool) -> dict[int, dict[str, Any]]:
    """Run each seed's arms by starting this bench again with that seed alone, all seeds at once (`at_once`: each
    with a Tandem of its own on a free port, so the cores stay busy while one seed waits on its slowest arm) or one
    after another; what they did, by seed."""
    paths = {seed: work / f"seed{seed}.json" for seed in seeds}
    waves = [seeds] if at_once else [[seed] for seed in seeds]
    for wave in waves:
        children = {}
        try:
            for seed in wave:
                paths[seed].unlink(missing_ok=True)
                command = [sys.executable, str(Path(__file__).resolve()), *argv, "--seeds", str(seed)]
                children[seed] = subprocess.Popen([*command, "--seed_json", str(paths[seed])], cwd=ROOT)
            failed = {seed: status for seed, child in children.items() if (status := child.wait()) != 0}
        except BaseException:
            # SIGTERM, not the kill subprocess.run would send: each seed's own `finally` stops its servers.
            for child in children.values():
                child.terminate()
            for child in children.values():
                child.wait(timeout=120)
            raise
        if failed:
            raise SystemExit(f"seeds failed (exit status by seed): {failed}")
    return {seed: json.loads(paths[seed].read_text()) for seed in seeds}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    work = (ROOT / args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    policy_dir = loop.base_policy(args, work)
    if args.seed_json:
        seed = args.seed_list[0]
        print(f"\nseed {seed}: arms {', '.join(args.arm_names)}", flush=True)
        Path(args.seed_json).write_text(json.dumps(run_seed(args, seed, policy_dir, work), default=str))
        return 0
    started = time.monotonic()
    runs = seeds_in_own_processes(argv, args.seed_list, work, at_once=not args.port)
    summary = summarise(runs, args.budget_minutes)
    base = {seed: next(iter(arms.values()))["base"] for seed, arms in runs.items()}
    print_report(summary, base)
    wall = time.monotonic() - started
    print(f"\nwall time {wall / 60:.1f} min (every seed and arm; not the base policy's making)")
    charts = {decoding: chart(summary, decoding) for decoding in DECODINGS}
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        key: value
        for key, value in vars(args).items()
        if key not in ("arm_names", "budget_minutes", "seed_list", "rounds", "method", "seed_json")
    }
    settings["annotator_seconds"] = args.annotator_seconds.argument()
    out.write_text(
        json.dumps(
            {
                "settings": settings,
                "arms": {name: asdict(ARMS[name]) for name in args.arm_names},
                "table": summary["table"],
                "differences": summary["differences"],
                "verdict": summary["verdict"],
                "base": {str(seed): figures for seed, figures in base.items()},
                "wall_seconds": wall,
                "plot_svg": charts,
                "raw": {str(seed): arms for seed, arms in runs.items()},
            },
            indent=1,
            default=str,
        )
    )
    print(f"figures: {out}")
    html = "".join(f"<div style='width:560px;display:inline-block;margin:8px'>{c}</div>" for c in charts.values())
    plot = ROOT / args.plot
    plot.parent.mkdir(parents=True, exist_ok=True)
    for decoding, svg in charts.items():
        plot.with_name(f"{plot.stem}-{decoding}.svg").write_text(svg)
    try:
        render_png(html, plot, width=1180, height=400)
        print(f"plot: {plot}")
    except RuntimeError as exc:
        print(f"plot: SVGs beside {plot} (no PNG: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
