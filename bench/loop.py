"""The whole loop, measured: the base policy's rollouts go to simulated annotators, their labels train a reward model
and a PRM, the policy is fine-tuned from them, and the new version's rollouts go back to the annotators, for R
rounds; held-out success against the number of labels, for random queries, active queries and PPO on the
environment's true reward (the upper bound).

Everything goes through Tandem as a researcher would use it: a real web server (gunicorn) and Celery worker are
started on a fresh data directory with the embedded defaults (SQLite and the filesystem broker; DATABASE_URL and
CELERY_BROKER_URL are ignored), and this script only calls the REST API: it launches rollout runs that queue
comparisons and step-label items by the project's query strategy, lets a crowd of simulated annotators (B-Pref
scripted teachers, `feedback_app.simulated`) label them over HTTP, freezes snapshots, trains the judges and the
policy, and reads the held-out success the policy runs record. Only the setup (users, tokens, projects, tasks, the
base policy version) is written through the ORM.

    .venv/bin/python bench/loop.py                        # the defaults: 12.5-19 minutes on 2 CPU cores
    .venv/bin/python bench/loop.py --rounds 2 --comparisons 60 --iterations 2 --eval_tasks 40    # a smoke run
    .venv/bin/python bench/loop.py --cases random,active --method dpo --step_items 16
    .venv/bin/python bench/loop.py --cases random,active --comparisons 24 --active_comparisons 12 --samples 4 # 2nd bar
    .venv/bin/python bench/loop.py --env toolshop         # the tool-calling shop and its shipped tiny policy
    .venv/bin/python bench/loop.py --env toolshop_careless --settings '{"ppo": {"learning_rate": 1e-4}}'

`--env` picks the environment: the gridworld (the default) or the tool shop, whose agent answers in chat turns with
tool calls; `toolshop_careless` is the shop at difficulty 1 played by an agent that slips at temperature 1
(`simulation.careless_agent`, built once into `--work_dir`), the case feedback can fix. Every label the crowd
stores records the seconds the annotator-time model (`feedback_app.annotator_time`, set with `--annotator_seconds`)
gives its kind, and each round reports the annotator minutes spent so far.

Per round, for the random and the active case alike:
1. the current policy plays `--tasks` fresh training tasks × `--samples`; the rollout run queues `--comparisons`
   (the active case: `--active_comparisons`) pairs of them (among the `--samples` choose 2 per task) by the
   project's query strategy (random, or the reward ensemble's disagreement; the first round of the active case has
   no reward model yet and falls back to random, which the label records), and `--step_items` single trajectories
   for step labels and critiques (and interventions, which only `--method dpo` learns from);
2. the crowd labels the queue empty through the API;
3. a reward-model ensemble (`--ensemble` members) and a PRM train on snapshots of every label so far (learning
   rates 1e-3 and 5e-3, bench/judge_oracle.py's recipe for a tiny model);
4. the policy trains from its current version: PPO on RM + PRM (`--method ppo`), step DPO on the interventions'
   corrections (`dpo`), whole-trajectory DPO on the comparisons themselves (`dpo_trajectory`; its SFT term
   imitates the preferred trajectory), or Nash-MD on the reward model's preferences (`nash_md`);
5. its held-out success (greedy, and sampled: `--eval_samples` episodes of each of `--eval_tasks` of the
   environment's 200 tasks) is read from the run.
The cases run side by side: each submits its runs as it goes, and the worker's `--parallel` processes (one per core
by default, each with an equal share of torch's threads) take them in turn.
On the gridworld, each round's reward model is also scored, outside the loop, on one fixed set of oracle-ordered
pairs (the base policy's two rollouts of `--test_tasks` tasks no round plays): how often it ranks the oracle's better
trajectory higher. Unlike its own held-out split, these pairs are the same for every case and round, so they compare
what the labels of random and of active queries taught it.
The oracle case runs PPO from the same base for the same iterations per round with the environment's true reward
and no labels.

Prints the table, writes it as JSON (`--out`) and plots held-out success against labels (`--plot`, PNG; rendered by
Chromium from the same SVG the dashboard draws, with the SVG kept beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the loop_* modules beside it
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from loop_oracle_pairs import oracle_test_pairs  # noqa: E402
from loop_plot import plot  # noqa: E402
from loop_report import report  # noqa: E402
from loop_rounds import Loop, Point  # noqa: E402
from loop_servers import Servers, free_port  # noqa: E402
from loop_setup import ENVIRONMENTS, base_policy, set_up  # noqa: E402

CASES = ("random", "active", "oracle")
METHODS = ("ppo", "dpo", "dpo_trajectory", "nash_md")
# The crowd: B-Pref scripted teachers of differing rationality and mistake rates (Lee et al., 2021).
DEFAULT_CROWD = [
    {"name": "careful", "beta": 50.0, "epsilon": 0.05},
    {"name": "typical", "beta": 20.0, "epsilon": 0.1},
    {"name": "hasty", "beta": 10.0, "epsilon": 0.15, "gamma": 0.95},
]


def crowd_members(path: str, seed: int) -> list[dict[str, Any]]:
    """The simulated crowd: the TeacherConfig dicts in the JSON file `path` (default: `DEFAULT_CROWD`), each named
    and seeded from `seed` unless it says otherwise."""
    crowd = json.loads(Path(path).read_text()) if path else [dict(member) for member in DEFAULT_CROWD]
    for number, member in enumerate(crowd):
        member.setdefault("name", f"teacher{number}")
        member.setdefault("seed", seed * 100 + number)
    return crowd


def _annotator_time(text: str):
    from feedback_app.annotator_time import AnnotatorTime

    try:
        return AnnotatorTime.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_crowd_and_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the simulated crowd, the web server and the worker, shared by the benches that run the loop."""
    parser.add_argument("--crowd", default="", help="A JSON list of TeacherConfig dicts (default: 3 teachers).")
    parser.add_argument(
        "--annotator_seconds",
        type=_annotator_time,
        default="",
        help="Seconds each simulated label records, by kind (comparison=25,step_label=4; the rest keep the "
        "defaults of feedback_app.annotator_time). The dashboard's overview gives a project's medians in this form.",
    )
    parser.add_argument("--port", type=int, default=0, help="The web server's port (default: a free one).")
    parser.add_argument(
        "--parallel",
        type=int,
        default=0,
        help="Worker processes, each with an equal share of the cores' torch threads; every case submits its runs "
        "at once (default: as many as there are cases, at most the CPU count).",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="gridworld", choices=sorted(ENVIRONMENTS), help="The environment played.")
    parser.add_argument("--cases", default=",".join(CASES), help="Comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--method", default="ppo", choices=METHODS, help="How the policy learns from the labels.")
    parser.add_argument("--rounds", type=int, default=4, help="Rounds R of the loop.")
    parser.add_argument("--tasks", type=int, default=64, help="Fresh training tasks the policy plays per round.")
    parser.add_argument("--samples", type=int, default=3, help="Rollouts per task (candidate pairs: samples C 2).")
    parser.add_argument("--comparisons", type=int, default=100, help="Comparisons queued per round.")
    parser.add_argument(
        "--active_comparisons",
        type=int,
        default=0,
        help="Comparisons queued per round in the active case (default: --comparisons). Half of --comparisons asks "
        "the second bar at equal training: the same rounds and policy updates as the random case, half its labels.",
    )
    parser.add_argument("--step_items", type=int, default=8, help="Trajectories queued per round for step labels.")
    parser.add_argument("--ensemble", type=int, default=2, help="Reward-model ensemble members.")
    parser.add_argument("--iterations", type=int, default=6, help="PPO (or Nash-MD) iterations per round.")
    parser.add_argument("--episodes", type=int, default=16, help="PPO episodes (Nash-MD tasks) per iteration.")
    parser.add_argument("--eval_tasks", type=int, default=200, help="Held-out tasks scored per policy (at most 200).")
    parser.add_argument(
        "--eval_samples",
        type=int,
        default=4,
        help="Sampled episodes per held-out task (one: a gain's standard error is about 3.7 points; four: 2.4).",
    )
    parser.add_argument("--test_tasks", type=int, default=120, help="Tasks of the reward models' oracle test pairs.")
    parser.add_argument("--policy", default="", help="The base policy directory (default: bootstrap one, seed 0).")
    parser.add_argument("--work_dir", default="var/bench/loop", help="The data directory, logs and base policy.")
    parser.add_argument("--out", default="var/bench/loop.json", help="The figures as JSON.")
    parser.add_argument("--plot", default="var/bench/loop.png", help="The plot (PNG; the SVG goes beside it).")
    parser.add_argument("--settings", default="{}", help='Run config overrides, JSON: {"ppo": {"kl_beta": 0.05}}.')
    add_crowd_and_server_arguments(parser)
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Seeds the tasks, the teachers, the judges and the policy runs (the base policy is seed 0's).",
    )
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--cases: unknown {sorted(unknown)}; the cases are {', '.join(CASES)}")
    for name in (
        "rounds",
        "tasks",
        "comparisons",
        "ensemble",
        "iterations",
        "episodes",
        "eval_tasks",
        "eval_samples",
        "test_tasks",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1")
    if args.parallel < 0:
        parser.error("--parallel: must be 0 (the default) or positive")
    if args.active_comparisons < 0:
        parser.error("--active_comparisons: must be 0 (the default: --comparisons) or positive")
    args.active_comparisons = args.active_comparisons or args.comparisons
    if args.samples < 2:
        parser.error("--samples: must be at least 2 (a comparison needs two rollouts of a task)")
    candidates = args.tasks * args.samples * (args.samples - 1) // 2
    for name in ("comparisons", "active_comparisons"):
        if getattr(args, name) > candidates:
            parser.error(
                f"--{name}: a round has only {candidates} candidate pairs (--tasks {args.tasks} x --samples "
                f"{args.samples} choose 2); raise --tasks or --samples"
            )
    if args.method == "dpo" and args.step_items < 16:
        # Step DPO learns from the interventions' (correction > original) pairs, about one per step item, and
        # balancing them per action leaves none of a handful (a first round of 6 gave "no usable pairs").
        parser.error("--step_items: --method dpo learns from the interventions on step items; use 16 or more")
    try:
        args.settings = json.loads(args.settings)
    except json.JSONDecodeError as exc:
        parser.error(f"--settings: not JSON ({exc})")
    return args


def run_cases(loop: Loop, cases: list[str], policy_dir: Path, data_dir: Path) -> dict[str, tuple[dict, list[Point]]]:
    """Start Tandem on a fresh `data_dir`, set up one project per case from `policy_dir`, and run `loop`'s cases at
    once; each case's base-policy figures and rounds."""
    args = loop.args
    shutil.rmtree(data_dir, ignore_errors=True)
    parallel = args.parallel or min(len(cases), os.cpu_count() or 1)
    servers = Servers(data_dir, args.port or free_port(), concurrency=parallel)
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        os.environ.pop(name, None)
    # The base policy lies outside the project's own artifact folders: the bench shares its folder, as an operator
    # shares a base model (TANDEM_SHARED_MODEL_ROOTS).
    os.environ.update(
        TANDEM_DATA_DIR=str(data_dir),
        DJANGO_SETTINGS_MODULE="feedback_app.settings",
        TANDEM_SHARED_MODEL_ROOTS=str(policy_dir.parent),
    )
    subprocess.run([sys.executable, "-m", "feedback_app.secret_key"], cwd=ROOT, env=servers.env(), check=True)
    servers.manage("migrate", "--noinput", "-v", "0")
    loop.connect(servers.url, set_up(args, cases, policy_dir, loop.crowd))
    servers.start()
    print(
        f"Tandem at {servers.url} (data {data_dir}); cases {', '.join(cases)} at once on {parallel} worker processes",
        flush=True,
    )
    # Every case submits its runs as it goes; the worker's processes take them in turn, so a case that is labelling
    # or scoring leaves its process to another case's next run.
    pool = ThreadPoolExecutor(max_workers=len(cases))
    try:
        running = {case: pool.submit(loop.run_case, case) for case in cases}
        return {case: future.result() for case, future in running.items()}
    finally:
        # A failed case stops the servers at once; the other cases' next API calls then fail and end their threads.
        servers.stop()
        pool.shutdown(wait=False, cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # `kill` (SIGTERM) ends the benchmark through its `finally`, which stops the web server and the worker; by
    # default it would end only this process and leave both running.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    cases = args.cases.split(",")
    crowd = crowd_members(args.crowd, args.seed)
    for member in crowd:
        # Only step DPO learns from interventions; elsewhere each one's continuation (~2 s of the worker's time)
        # would buy nothing.
        member.setdefault("interventions", args.method == "dpo")
    work = (ROOT / args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    policy_dir = base_policy(args, work)
    started = time.monotonic()  # the loop's wall time: a first run's bootstrap (2-3 minutes, kept) is not in it
    scored = ENVIRONMENTS[args.env].oracle_pairs and set(cases) - {"oracle"}
    test_pairs = oracle_test_pairs(policy_dir, args.test_tasks, args.seed) if scored else []
    if test_pairs:
        print(f"{len(test_pairs)} oracle-ordered test pairs score every reward model", flush=True)
    results = run_cases(Loop(args, crowd, test_pairs), cases, policy_dir, work / "data")
    verdict = report(results, args)
    wall = time.monotonic() - started
    print(f"\nwall time {wall / 60:.1f} min (set-up, servers and every case; not the base policy's bootstrap)")
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = vars(args) | {"settings": args.settings, "annotator_seconds": args.annotator_seconds.argument()}
    charts = plot(results, ROOT / args.plot)
    out.write_text(
        json.dumps(
            {
                "settings": settings,
                "crowd": crowd,
                "cases": {
                    case: {"base": base, "points": [asdict(p) for p in points]}
                    for case, (base, points) in results.items()
                },
                "verdict": verdict,
                "wall_seconds": wall,
                "plot_svg": charts,
            },
            indent=2,
        )
    )
    print(f"figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
