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

`--env` picks the environment: the gridworld (the default) or the tool shop, whose agent answers in chat turns with
tool calls. Every label the crowd stores records the seconds the annotator-time model (`feedback_app.annotator_time`,
set with `--annotator_seconds`) gives its kind, and each round reports the annotator minutes spent so far.

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
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CASES = ("random", "active", "oracle")
METHODS = ("ppo", "dpo", "dpo_trajectory", "nash_md")
# The crowd: B-Pref scripted teachers of differing rationality and mistake rates (Lee et al., 2021).
DEFAULT_CROWD = [
    {"name": "careful", "beta": 50.0, "epsilon": 0.05},
    {"name": "typical", "beta": 20.0, "epsilon": 0.1},
    {"name": "hasty", "beta": 10.0, "epsilon": 0.15, "gamma": 0.95},
]
STRATEGY = {"random": "random", "active": "disagreement"}


def crowd_members(path: str, seed: int) -> list[dict[str, Any]]:
    """The simulated crowd: the TeacherConfig dicts in the JSON file `path` (default: `DEFAULT_CROWD`), each named
    and seeded from `seed` unless it says otherwise."""
    crowd = json.loads(Path(path).read_text()) if path else [dict(member) for member in DEFAULT_CROWD]
    for number, member in enumerate(crowd):
        member.setdefault("name", f"teacher{number}")
        member.setdefault("seed", seed * 100 + number)
    return crowd


def _gridworld_config() -> dict[str, Any]:
    from reward_models.policy.bootstrap import BootstrapConfig

    return BootstrapConfig().env_config()


def _gridworld_base(path: Path) -> None:
    """The tiny gridworld Llama, trained for seed 0 (2-3 minutes)."""
    from reward_models.policy.bootstrap import BootstrapConfig
    from reward_models.policy.bootstrap import main as bootstrap

    bootstrap(BootstrapConfig(output_dir=str(path), seed=0, max_seconds=1800.0))


def _toolshop_config() -> dict[str, Any]:
    from reward_models.policy.tool_bootstrap import ToolBootstrapConfig

    return ToolBootstrapConfig().env_config()


def _toolshop_base(path: Path) -> None:
    """The shipped tool-calling Qwen2, copied (seconds)."""
    from reward_models.policy.tool_bootstrap import ToolBootstrapConfig
    from reward_models.policy.tool_bootstrap import main as bootstrap

    bootstrap(ToolBootstrapConfig(output_dir=str(path), eval_tasks=8))


@dataclass(frozen=True)
class Environment:
    """A registered environment the loop runs on: where its class lives, its settings, how its base policy is made,
    and how its judges read it."""

    name: str
    dotted_path: str
    config: Callable[[], dict[str, Any]]
    bootstrap: Callable[[Path], None]
    # The reward model's layout (`reward_models.reward`); None reads whole conversations.
    reward_layout: str | None
    # Whether the reward model is also scored on oracle-ordered test pairs (`oracle_test_pairs`): the gridworld's
    # scripted episodes make them.
    oracle_pairs: bool


ENVIRONMENTS = {
    # The first and last map and the actions, not the policy's reasoning: a `decisions` reward model (reasoning
    # included) scored a PPO policy that writes "goal is down 0" and never moves above the base policy's failures
    # more than a `moves` one does, at the same oracle-pair accuracy, and a `moves` model trains faster.
    "gridworld": Environment(
        "gridworld", "reward_models.envs.gridworld.GridWorld", _gridworld_config, _gridworld_base, "moves", True
    ),
    # Tool calls and their results: the reward model reads the whole conversation, tools included.
    "toolshop": Environment(
        "toolshop", "reward_models.envs.toolshop.ToolShop", _toolshop_config, _toolshop_base, None, False
    ),
}


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


# --- the servers --------------------------------------------------------------------------------------------------


@dataclass
class Servers:
    """gunicorn and a Celery worker on a fresh data directory; stopped (with their process groups) on exit."""

    data_dir: Path
    port: int
    concurrency: int = 1
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "TANDEM_DATA_DIR": str(self.data_dir), "DJANGO_SETTINGS_MODULE": "feedback_app.settings"}

    def manage(self, *command: str) -> None:
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=self.env(), check=True)

    def start(self) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        bin_dir = Path(sys.executable).parent
        worker = [str(bin_dir / "celery"), "-A", "training", "worker", "-Q", "rollouts,training,default"]
        worker += ["--concurrency", str(self.concurrency), "--loglevel", "INFO"]
        web = [str(bin_dir / "gunicorn"), "feedback_app.wsgi", "--bind", f"127.0.0.1:{self.port}"]
        web += ["--workers", "2", "--threads", "4", "--timeout", "300"]
        # Each worker process gets an equal share of the cores: two one-thread runs of a tiny model side by side
        # finish well before the same two one after the other on two threads.
        threads = str(max(1, (os.cpu_count() or 1) // self.concurrency))
        environments = {"worker": {**self.env(), "TANDEM_TORCH_THREADS": threads}, "web": self.env()}
        for command, name in ((worker, "worker"), (web, "web")):
            with open(logs / f"{name}.log", "w") as out:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=environments[name],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the web server did not start; see {logs / 'web.log'}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- setup: the only ORM writes -------------------------------------------------------------------------------------


def base_policy(args: argparse.Namespace, work: Path) -> Path:
    if args.policy:
        return Path(args.policy).resolve()
    path = work / f"base-policy-{args.env}"
    if not (path / "config.json").is_file():
        print(f"making the base policy in {path} (kept for later runs)", flush=True)
        ENVIRONMENTS[args.env].bootstrap(path)
    return path.resolve()


def set_up(args: argparse.Namespace, cases: list[str], policy_dir: Path, crowd: list[dict]) -> dict[str, Any]:
    """A researcher, the crowd and one project per case (the same tasks and base policy in each); their ids and
    API keys."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from feedback_app.models import ApiToken, EnvironmentSpec, Membership, PolicyVersion, Project, Role, Task
    from feedback_app.models.trajectories import TaskSplit
    from reward_models.envs import training_seeds

    User = get_user_model()
    environment = ENVIRONMENTS[args.env]
    spec, _ = EnvironmentSpec.objects.get_or_create(
        name=environment.name, defaults={"dotted_path": environment.dotted_path, "config": environment.config()}
    )
    env = spec.load()
    seeds = list(training_seeds(env, args.tasks * args.rounds, start=args.seed * 1_000_000 + 500_000))
    researcher = User.objects.create_user("loop-researcher")
    annotators = [User.objects.create_user(f"sim-{member['name']}") for member in crowd]
    setup: dict[str, Any] = {
        "researcher_key": ApiToken.issue(researcher, "loop bench")[1],
        "crowd_keys": [ApiToken.issue(user, "loop bench")[1] for user in annotators],
        "projects": {},
    }
    for case in cases:
        project = Project.objects.create(
            name=f"Loop bench: {case}", slug=f"loop-{case}", environment=spec, overlap=1, blind=True, gold_fraction=0
        )
        Membership.objects.create(user=researcher, project=project, role=Role.RESEARCHER)
        Membership.objects.bulk_create(Membership(user=u, project=project, role=Role.ANNOTATOR) for u in annotators)
        tasks = Task.objects.bulk_create(
            Task(
                project=project,
                seed=seed,
                split=TaskSplit.TRAIN,
                spec=(t := env.make_task(seed)),
                instruction=t["instruction"],
            )
            for seed in seeds
        )
        policy = PolicyVersion.objects.create(
            project=project, name="tiny-base", kind="local", weights_path=str(policy_dir)
        )
        setup["projects"][case] = {
            "id": project.pk,
            "policy": policy.pk,
            "tasks": [task.pk for task in sorted(tasks, key=lambda t: t.pk)],
        }
    return setup


# --- the loop, through the API -----------------------------------------------------------------------------------


@dataclass
class Point:
    round: int
    comparisons: int
    step_items: int
    greedy: float
    greedy_stderr: float
    sampled: float
    sampled_stderr: float
    policy_version: int
    seconds: float
    # The simulated annotators' time so far, by the annotator-time model (`feedback_app.annotator_time`).
    annotator_minutes: float = 0.0
    interventions: int = 0
    # Each held-out task's success, by decoding: what a comparison of two cases pairs.
    per_task: dict[str, list[float]] = field(default_factory=dict)
    strategies: dict[str, int] = field(default_factory=dict)
    judges: dict[str, Any] = field(default_factory=dict)
    # Gains over the base policy, paired over the same held-out tasks (`success_gain`: sampled_gain,
    # sampled_gain_stderr, ...).
    gains: dict[str, float] = field(default_factory=dict)


class Loop:
    """The cases' rounds against a running Tandem (`connect` gives its URL and the set-up's ids and keys)."""

    def __init__(self, args: argparse.Namespace, crowd: list[dict], test_pairs: list) -> None:
        self.args = args
        self.time_model = args.annotator_seconds
        self.crowd = crowd
        self.test_pairs = test_pairs
        # Cases run in threads of their own: each prints under its name, and one crowd labels at a time (the
        # embedded SQLite takes one writer).
        self.local = threading.local()
        self.labelling = threading.Lock()

    def connect(self, url: str, setup: dict[str, Any]) -> None:
        from feedback_app.simulated.api_client import ApiClient

        self.url = url
        self.setup = setup
        self.api = ApiClient(url, setup["researcher_key"])

    def say(self, text: str) -> None:
        print(f"[{getattr(self.local, 'case', '-')}] {text}", flush=True)

    # Runs

    def launch(self, project: int, body: dict[str, Any]) -> dict[str, Any]:
        run = self.api.post(f"/api/projects/{project}/runs/", body)[1]
        return self.wait(project, run["id"])

    def wait(self, project: int, run_id: int) -> dict[str, Any]:
        last = ""
        while True:
            run = self.api.get(f"/api/projects/{project}/runs/{run_id}/")
            line = f"    run {run_id} {run['kind']}: {run['status']} {run['progress_current']}/{run['progress_total']}"
            if line != last:
                self.say(line)
                last = line
            if run["status"] == "succeeded":
                return run
            if run["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"run {run_id} ({run['kind']}) {run['status']}:\n{run.get('error') or run['log']}")
            time.sleep(1)

    def round_seed(self, round_: int) -> int:
        """The seed of a round's rollout, judges and policy run: `--seed` picks the run, the round its part."""
        return self.args.seed * 100 + round_

    def overrides(self, kind: str) -> dict[str, Any]:
        return dict(self.args.settings.get(kind, {}))

    # Labels

    def labels(self, case: str) -> bool:
        """Whether the case's rounds roll out and label (the oracle's learn from the environment's reward alone)."""
        return case != "oracle"

    def label(self, project: int, case: str, round_: int, spent: float) -> dict[str, Any]:
        """The round's labels: the crowd labels the queue empty (`spent`: the case's annotator seconds so far)."""
        return self.run_crowd(project)

    def run_crowd(
        self, project: int, teacher: dict[str, Any] | None = None, budget: float | None = None
    ) -> dict[str, Any]:
        """The crowd labels the project's queue empty, each member with `teacher`'s settings over its own, or until
        their labels record `budget` seconds of annotator time."""
        from feedback_app.simulated.annotator import run_crowd
        from feedback_app.simulated.teacher import TeacherConfig

        members = [
            (key, TeacherConfig.from_dict({k: v for k, v in {**member, **(teacher or {})}.items() if k != "name"}))
            for key, member in zip(self.setup["crowd_keys"], self.crowd, strict=True)
        ]
        with self.labelling:
            return run_crowd(self.url, project, members, time_model=self.time_model, max_seconds=budget)

    def strategies(self, project: int) -> dict[str, int]:
        """How many current comparisons were asked under each query strategy (as recorded on the labels)."""
        tally: dict[str, int] = {}
        path = f"/api/projects/{project}/comparisons/?page_size=500"
        while path:
            page = self.api.get(path)
            for label in page["results"]:
                tally[label["query_strategy"] or "?"] = tally.get(label["query_strategy"] or "?", 0) + 1
            path = page["next"]
        return tally

    # Judges

    def snapshot(self, project: int, kind: str, name: str) -> int:
        return self.api.post(f"/api/projects/{project}/snapshots", {"name": name, "export_kind": kind})[1]["id"]

    def judges(self, project: int, round_: int, case: str) -> dict[str, Any]:
        """The round's reward model and PRM, trained on every label so far, and their figures."""
        rm, prm = self.reward_model(project, round_), self.prm(project, round_)
        figures: dict[str, Any] = {}
        if self.test_pairs:
            model = self.api.get(f"/api/projects/{project}/models/{rm['summary']['registered_model']}/")
            accuracy = oracle_accuracy(model["path"], self.test_pairs)
            figures = {"rm_oracle_accuracy": accuracy.pop("all"), "rm_oracle_accuracy_by_type": accuracy}
        return {
            **figures,
            "reward_model": rm["summary"]["registered_model"],
            "prm": prm["summary"]["registered_model"],
            "rm_own_heldout_accuracy": (rm["summary"].get("metrics") or {}).get("accuracy"),
            "rm_seconds": rm["summary"].get("train_seconds"),
            "prm_seconds": prm["summary"].get("train_seconds"),
        }

    def reward_model(self, project: int, round_: int) -> dict[str, Any]:
        """A reward-model ensemble trained on a snapshot of every comparison so far; its finished run."""
        return self.launch(
            project,
            {
                "kind": "reward_model",
                "snapshot": self.snapshot(project, "preference", f"preferences-r{round_}"),
                "config": {
                    "name": f"rm-r{round_}",
                    "ensemble_size": self.args.ensemble,
                    **({"layout": layout} if (layout := ENVIRONMENTS[self.args.env].reward_layout) else {}),
                    "num_epochs": 3,
                    # The tiny policy's recipe (bench/judge_oracle.py's); the pipeline's 1e-4 suits pretrained models
                    # and left the reward model below "the shorter trajectory wins" (held out 0.52 against 0.71).
                    "learning_rate": 1e-3,
                    "seed": self.round_seed(round_),
                    **self.overrides("reward_model"),
                },
            },
        )

    def prm(self, project: int, round_: int) -> dict[str, Any]:
        """A PRM trained on a snapshot of every step label so far; its finished run."""
        return self.launch(
            project,
            {
                "kind": "prm",
                "snapshot": self.snapshot(project, "stepwise", f"steps-r{round_}"),
                "config": {
                    "name": f"prm-r{round_}",
                    "learning_rate": 5e-3,  # bench/judge_oracle.py's recipe for a tiny model, as above
                    "num_epochs": 5,
                    "seed": self.round_seed(round_),
                    **self.overrides("prm"),
                },
            },
        )

    # The policy

    def policy_run(self, method: str, policy: int, round_: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """A policy run's request body and config, before its judges or snapshot: evaluated on the held-out tasks
        (the base too in the first round; a later round starts from the last round's result, already evaluated)."""
        config: dict[str, Any] = {
            "seed": self.round_seed(round_),
            "eval_tasks": self.args.eval_tasks,
            "eval_samples": self.args.eval_samples,
            "eval_base": round_ == 0,
        }
        if method in ("ppo", "nash_md"):
            config.update(max_steps=self.args.iterations, save_steps=self.args.iterations)
        if method == "ppo":
            # No environment signal picks the checkpoint: the last iteration is the result.
            config.update(rollouts_per_step=self.args.episodes, selection_tasks=0)
        return {"kind": method, "base_policy": policy, "review": {"enabled": False}}, config

    def train_policy(
        self, project: int, policy: int, round_: int, judges: dict[str, Any] | None, case: str
    ) -> dict[str, Any]:
        method = "ppo" if judges is None else self.args.method
        body, config = self.policy_run(method, policy, round_)
        if method == "ppo":
            if judges is None:
                config["reward_source"] = "oracle"
            else:
                body["judges"] = {"reward_model_path": judges["reward_model"], "prm_path": judges["prm"]}
        elif method == "dpo":
            body["snapshot"] = self.snapshot(project, "step_preference", f"step-preferences-r{round_}")
        elif method == "dpo_trajectory":  # a preference snapshot makes the DPO run trajectory-level
            body["kind"] = "dpo"
            body["snapshot"] = self.snapshot(project, "preference", f"policy-preferences-r{round_}")
        else:  # Nash-MD against the reward model's P(a > b)
            config.update(batch_size=self.args.episodes)
            body["judges"] = {"preference_model_path": judges["reward_model"]}
        body["config"] = {**config, **self.overrides(method)}
        run = self.launch(project, body)
        return run["summary"]

    def rollout(self, project: int, policy: int, round_: int, case: str) -> dict[str, Any]:
        tasks = self.setup["projects"][case]["tasks"][round_ * self.args.tasks : (round_ + 1) * self.args.tasks]
        config = {
            "task_ids": tasks,
            "samples_per_task": self.args.samples,
            "seed": self.round_seed(round_),
            "queue_comparisons": self.args.active_comparisons if case == "active" else self.args.comparisons,
            "queue_step_labels": self.args.step_items,
        }
        return self.launch(project, {"kind": "rollout", "policy_version": policy, "config": config})["summary"]

    # A case

    def run_case(self, case: str) -> tuple[dict[str, Any], list[Point]]:
        from reward_models.finetune.evaluation import success_gain

        self.local.case = case
        info = self.setup["projects"][case]
        project, policy = info["id"], info["policy"]
        if case in STRATEGY:
            self.api.request("PATCH", f"/api/projects/{project}/", {"query_strategy": STRATEGY[case]})
        points: list[Point] = []
        base: dict[str, Any] = {}
        labelled = {"comparison": 0, "step_items": 0, "intervention": 0, "seconds": 0.0}
        for round_ in range(self.args.rounds):
            started = time.monotonic()
            self.say(f"round {round_ + 1}/{self.args.rounds}")
            judges = None
            if self.labels(case):
                summary = self.rollout(project, policy, round_, case)
                self.say(f"    rollout: {json.dumps(summary.get('queued', {}))}")
                crowd = self.label(project, case, round_, labelled["seconds"])
                self.say(f"    labelled in {crowd['seconds']:.0f} s: {json.dumps(crowd['total'])}")
                labelled["comparison"] += crowd["total"].get("comparison", 0)
                labelled["step_items"] += crowd["total"].get("items", 0) - crowd["total"].get("comparison", 0)
                labelled["intervention"] += crowd["total"].get("intervention", 0)
                labelled["seconds"] += crowd["total"].get("seconds", 0.0)
                judges = self.judges(project, round_, case)
            summary = self.train_policy(project, policy, round_, judges, case)
            metrics = summary.get("metrics") or {}
            base = base or metrics.get("base") or {}
            final = metrics.get("final") or {}
            policy = summary["policy_version"]
            points.append(
                Point(
                    round=round_ + 1,
                    comparisons=labelled["comparison"],
                    step_items=labelled["step_items"],
                    interventions=labelled["intervention"],
                    greedy=final.get("greedy_success", float("nan")),
                    greedy_stderr=final.get("greedy_stderr", float("nan")),
                    sampled=final.get("sampled_success", float("nan")),
                    sampled_stderr=final.get("sampled_stderr", float("nan")),
                    policy_version=policy,
                    seconds=time.monotonic() - started,
                    annotator_minutes=labelled["seconds"] / 60,
                    strategies=self.strategies(project) if self.labels(case) else {},
                    judges=judges or {},
                    gains=success_gain({"base": base, "final": final}),
                    per_task={
                        decoding: final[f"{decoding}_per_task"]
                        for decoding in ("greedy", "sampled")
                        if f"{decoding}_per_task" in final
                    },
                )
            )
            self.say(f"    -> {describe(points[-1])}")
        return base, points


# --- the measuring instrument: the reward model against the oracle -----------------------------------------------


def oracle_test_pairs(policy_dir: Path, tasks: int, seed: int) -> list[tuple[Any, Any]]:
    """(better, worse) pairs of the base policy's two sampled rollouts of `tasks` training tasks no round plays,
    ordered by the oracle's graded return; equal returns are left out. The same pairs score every reward model."""
    from reward_models.policy.bootstrap import BootstrapConfig
    from reward_models.policy.local import LocalCausalLMPolicy
    from simulation.episodes import policy_episodes

    policy = LocalCausalLMPolicy(policy_dir)
    episodes = policy_episodes(
        policy, tasks, samples_per_task=2, seed=seed, start=900_000, env_config=BootstrapConfig().env_config()
    )
    pairs = []
    for a, b in zip(episodes[::2], episodes[1::2], strict=True):
        if a.score != b.score:
            pairs.append((a, b) if a.score > b.score else (b, a))
    return pairs


def oracle_accuracy(model_dir: str, pairs: list[tuple[Any, Any]]) -> dict[str, float]:
    """How often the reward model scores the oracle's better trajectory higher (its members' mean reward), over
    all the pairs and by pair type."""
    from reward_models.reward.model import load_reward_model

    model = load_reward_model(model_dir, device="cpu")
    episodes = [episode for pair in pairs for episode in pair]
    cuts = [len(e.prompt) for e in episodes]
    rewards, _ = model.score(
        [e.messages[:cut] for e, cut in zip(episodes, cuts, strict=True)],
        [e.messages[cut:] for e, cut in zip(episodes, cuts, strict=True)],
    )
    return accuracy_by_type(pairs, [rewards[2 * i] > rewards[2 * i + 1] for i in range(len(pairs))])


def accuracy_by_type(pairs: list[tuple[Any, Any]], right: list[bool]) -> dict[str, float]:
    """The share of `right` over all the (better, worse) pairs (`all`) and per `simulation.episodes.pair_type`: a
    reward model can tell success from failure and still order two failures by chance, which an overall figure
    hides."""
    from simulation.episodes import pair_type

    groups: dict[str, list[bool]] = {"all": list(right)}
    for (better, worse), hit in zip(pairs, right, strict=True):
        groups.setdefault(pair_type(better, worse), []).append(hit)
    return {name: sum(hits) / len(hits) for name, hits in groups.items() if hits}


def describe(point: Point) -> str:
    accuracy = point.judges.get("rm_oracle_accuracy")
    by_type = by_type_text(point.judges.get("rm_oracle_accuracy_by_type") or {})
    judged = (
        f"reward model agrees with the oracle on {accuracy:.1%} of test pairs ({by_type}); "
        if accuracy is not None
        else ""
    )
    gains = "".join(
        f", {decoding} gain {point.gains[f'{decoding}_gain']:+.1%} ± {point.gains[f'{decoding}_gain_stderr']:.1%}"
        for decoding in ("greedy", "sampled")
        if f"{decoding}_gain_stderr" in point.gains
    )
    return (
        f"{point.comparisons} comparisons, {point.step_items} step labels, {point.annotator_minutes:.0f} annotator "
        f"minutes: {judged}greedy {point.greedy:.1%} "
        f"± {point.greedy_stderr:.1%}, sampled {point.sampled:.1%} ± {point.sampled_stderr:.1%}{gains} "
        f"({point.seconds:.0f} s)"
    )


# --- the report ----------------------------------------------------------------------------------------------------


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


def by_type_text(shares: dict[str, float]) -> str:
    """`one succeeded 95%, both failed 50%`: an `accuracy_by_type` without its `all`."""
    return ", ".join(f"{name.replace('_', ' ')} {share:.0%}" for name, share in shares.items())


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def plot(results: dict[str, tuple[dict[str, Any], list[Point]]], path: Path) -> dict[str, str]:
    """Held-out success against comparisons, sampled and greedy side by side, as SVG from the dashboard's chart
    module, and a PNG of the two rendered by Chromium (when it is installed). Returns the SVGs by decoding, which the
    figures carry for the benchmark page."""
    from feedback_app.charts import line_chart

    base = next(iter(results.values()))[0]
    largest = max((p.comparisons for _, points in results.values() for p in points), default=0) or 1
    charts = []
    for decoding in ("sampled", "greedy"):
        series: dict[str, list[tuple[float, float]]] = {}
        for case, (_, points) in results.items():
            if case == "oracle":  # no labels: its final success is drawn flat across the label axis
                final = 100 * getattr(points[-1], decoding)
                series["oracle reward (PPO, final)"] = [(0.0, final), (float(largest), final)]
            else:
                start = (0.0, 100 * base.get(f"{decoding}_success", 0.0))
                series[f"{case} queries"] = [
                    start,
                    *((float(p.comparisons), 100 * getattr(p, decoding)) for p in points),
                ]
        charts.append(
            line_chart(
                series,
                title=f"Held-out success, {decoding} decoding",
                x_label="comparisons labelled",
                y_label="success (%)",
                width=560,
                height=360,
            )
        )
    html = "".join(f"<div style='width:560px;display:inline-block;margin:8px'>{chart}</div>" for chart in charts)
    path.parent.mkdir(parents=True, exist_ok=True)
    svg_paths = []
    for decoding, chart in zip(("sampled", "greedy"), charts, strict=True):
        svg_paths.append(path.with_name(f"{path.stem}-{decoding}.svg"))
        svg_paths[-1].write_text(str(chart))
    try:
        render_png(html, path, width=1180, height=400)
        print(f"plot: {path} (and {', '.join(map(str, svg_paths))})")
    except RuntimeError as exc:  # no Chromium, or it failed: the SVGs are the plot
        print(f"plot: {', '.join(map(str, svg_paths))} (no PNG: {exc})")
    return {decoding: str(chart) for decoding, chart in zip(("sampled", "greedy"), charts, strict=True)}


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


def find_chromium() -> str | None:
    """The Chromium (or Chrome) on PATH, by the names Debian and others install it under."""
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def render_png(body: str, path: Path, width: int, height: int) -> None:
    """Screenshots `body` (HTML) into the PNG `path` with Chromium's own headless mode: the browser alone, no Python
    package (Playwright is a test extra, and `./run.sh` does not install it). RuntimeError says why it could not."""
    browser = find_chromium()
    if browser is None:
        raise RuntimeError("Chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "plot.html"
        page.write_text(f"<html><body style='margin:0;background:#fff;white-space:nowrap'>{body}</body></html>")
        path.unlink(missing_ok=True)
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # as root (containers, CI) Chromium refuses to start with its sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={scratch}/profile",
            f"--window-size={width},{height}",
            f"--screenshot={path.resolve()}",
            page.as_uri(),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{browser} did not finish the screenshot in {exc.timeout:.0f} s") from exc
        except OSError as exc:  # found on PATH but not runnable
            raise RuntimeError(f"{browser} could not be started: {exc}") from exc
    if done.returncode != 0 or not path.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{browser} exited with {done.returncode} and wrote no PNG: {last[:200]}")


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
