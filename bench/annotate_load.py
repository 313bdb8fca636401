"""Load benchmark of the annotators' busiest request: many simulated annotators labelling comparisons at once.

It creates a fresh PostgreSQL database (from DATABASE_URL, else postgres://tandem:tandem@127.0.0.1:5432/tandem_bench;
the database name must contain "bench", because it is dropped first), migrates it, seeds a gridworld project with
trajectories, comparison items and N annotators, and starts gunicorn on it. The project has been labelled for a
while before the run (--labelled-before labels by earlier annotators, 10,000 by default) and its tables analysed, as
autovacuum keeps them in a running deployment: on an empty database PostgreSQL plans the first statements for empty
tables (sequential scans of the assignments) and keeps those plans until autovacuum analyses the tables again, a
minute or more later, which is longer than the run. Then every simulated annotator (a thread) logs in through the
login form, opens the compare page, and repeatedly thinks for a while and sends the real submit-and-next POST (htmx
headers, the page's CSRF token and client token), reading the next item out of the answer. It prints the labels per
second sustained after a warm-up, the p50/p99 latency of the submit-and-next request, the CPU that gunicorn,
PostgreSQL and the client used, and checks that the labels stored during the run equal the successful submits and
that no item got more labels than its overlap. The database is dropped at the end unless --keep-database is given.

Each request comes on a new connection (`--keep-alive 0`), as people's do: they think for seconds between labels,
longer than gunicorn keeps an idle connection (2 s by default, the shipped setting), so their browsers reconnect for
each label; a few dozen fast simulated annotators stand in for hundreds of people. Kept-alive connections
(`--keep-alive 30`) stay with the worker process that accepted them, the
processes end up with unequal shares of the annotators, and the busiest one, whose threads share one core under
Python's lock, sets the latency while the others idle.

    .venv/bin/python bench/annotate_load.py                      # 80 annotators: the server's ceiling
    .venv/bin/python bench/annotate_load.py --annotators 12      # latency below the ceiling
    .venv/bin/python bench/annotate_load.py --workers 4 --threads 2 --think-ms 500 --duration 60

The client runs on the same machine as gunicorn and PostgreSQL and takes its share of the CPU; the output says how
much.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://tandem:tandem@127.0.0.1:5432/tandem_bench"
PASSWORD = "bench-" + secrets.token_hex(8)
PAIRS_PER_TASK = 15  # six trajectories of each task, every pair queued


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--annotators", type=int, default=80, help="Simulated annotators (one thread each).")
    parser.add_argument("--think-ms", type=float, default=300, help="Mean pause before each submit (±50 %%).")
    parser.add_argument("--duration", type=float, default=30, help="Measured seconds, after the warm-up.")
    parser.add_argument("--warmup", type=float, default=5, help="Seconds of load before measuring.")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn worker processes.")
    parser.add_argument("--threads", type=int, default=2, help="gunicorn threads per worker (gthread).")
    parser.add_argument(
        "--keep-alive",
        type=int,
        default=0,
        help="gunicorn's keep-alive, seconds. 0: a new connection per request, as people's browsers make them.",
    )
    parser.add_argument("--overlap", type=int, default=2, help="Labels wanted per comparison item.")
    parser.add_argument(
        "--labelled-before", type=int, default=10_000, help="Labels the project had before the run (by others)."
    )
    parser.add_argument("--port", type=int, default=0, help="Port for gunicorn; 0 picks a free one.")
    parser.add_argument("--keep-database", action="store_true", help="Leave the benchmark database in place.")
    parser.add_argument("--out", default="var/bench/annotate_load.json", help="Where the figures go (JSON).")
    return parser.parse_args()


# Setting up ----------------------------------------------------------------------------------------------------------


def fresh_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    if parsed.scheme not in ("postgres", "postgresql") or "bench" not in name:
        sys.exit(f"DATABASE_URL must name a PostgreSQL database with 'bench' in its name (it is dropped), got {url!r}")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def server_environment(database_url: str, data_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "feedback_app.settings",
        "DATABASE_URL": database_url,
        # Persistent connections: a new PostgreSQL connection per request costs more than the request itself.
        "DATABASE_CONN_MAX_AGE": "600",
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(40),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "TANDEM_DATA_DIR": str(data_dir),
        # Served like a deployment: collectstatic's hashed, compressed copies through WhiteNoise.
        "TANDEM_COLLECTED_STATIC": "true",
        "STATIC_ROOT": str(data_dir / "static"),
        "LOG_LEVEL": "WARNING",
    }


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def gridworld_steps(env, spec: dict, rng: random.Random, skill: float) -> list[dict]:
    """One episode: the oracle's best move with probability `skill`, else a random move."""
    from reward_models.envs.gridworld import ACTIONS

    oracle = env.oracle(spec)
    observation, actions, steps = env.reset(spec), [], []
    for index in range(env.max_steps):
        best = oracle.best_actions(actions)
        if not best:
            break
        action = best[0] if rng.random() < skill else rng.choice(ACTIONS)
        result = env.step(action)
        reasoning = "the goal is that way" if action in best else "walls everywhere, try another way"
        steps.append(
            {
                "index": index,
                "observation": observation,
                "reasoning": reasoning,
                "action": action,
                "env_reward": result.reward,
                "done": result.done,
                "render": env.render(observation),
                "message": env.message_for_action(action, reasoning),
                "replies": [{"role": "user", "content": result.observation}],
            }
        )
        actions.append(action)
        observation = result.observation
        if result.done:
            break
    return steps


def seed(args: argparse.Namespace, items_wanted: int) -> tuple[int, list[str]]:
    """A gridworld project with enough comparison items, the labels it had before the run, and the annotators.
    Returns the project id and the annotators' usernames."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import connection, transaction

    from feedback_app import queue
    from feedback_app.models import EnvironmentSpec, Membership, PolicyVersion, Project, Step, Task, Trajectory
    from reward_models.envs.base import prompt_messages
    from reward_models.envs.gridworld import GridWorld

    env, rng = GridWorld(), random.Random(0)
    items_done = -(-args.labelled_before // args.overlap)
    tasks = -(-(items_wanted + items_done) // PAIRS_PER_TASK)
    with transaction.atomic():
        spec = EnvironmentSpec.objects.create(name="gridworld", dotted_path="reward_models.envs.gridworld.GridWorld")
        project = Project.objects.create(
            name="Load benchmark", environment=spec, overlap=args.overlap, guidelines="Prefer the shorter path."
        )
        policies = [
            PolicyVersion.objects.create(project=project, name=f"agent-v{n}", kind="external") for n in range(3)
        ]
        task_rows = Task.objects.bulk_create(
            Task(project=project, seed=seed, spec=env.make_task(seed), instruction=env.make_task(seed)["instruction"])
            for seed in range(tasks)
        )
        episodes = [
            (task, gridworld_steps(env, task.spec, rng, rng.uniform(0.3, 1.0))) for task in task_rows for _ in range(6)
        ]
        trajectories = Trajectory.objects.bulk_create(
            Trajectory(
                project=project,
                task=task,
                policy_version=rng.choice(policies),
                source="import",
                prompt=prompt_messages(env, task.spec, steps[0]["observation"]) if steps else [],
                num_steps=len(steps),
                success=bool(steps and steps[-1]["done"] and steps[-1]["env_reward"] > 0),
            )
            for task, steps in episodes
        )
        Step.objects.bulk_create(
            (
                Step(trajectory=trajectory, **step)
                for trajectory, (_, steps) in zip(trajectories, episodes, strict=True)
                for step in steps
            ),
            batch_size=2000,
        )
        items = queue.enqueue_comparisons(project, queue.pairs_within_tasks(trajectories))
        password = make_password(PASSWORD)  # hashed once: every annotator shares it
        users = get_user_model().objects.bulk_create(
            get_user_model()(username=f"bench-{n:03d}", password=password) for n in range(args.annotators)
        )
        Membership.objects.bulk_create(Membership(user=user, project=project, role="annotator") for user in users)
        label_before(project, items[:items_done], password, rng)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    mean_steps = statistics.mean(len(steps) for _, steps in episodes)
    print(
        f"seeded {len(trajectories)} trajectories ({mean_steps:.1f} steps on average), "
        f"{len(items)} comparison items × overlap {args.overlap} ({items_done} labelled before the run), "
        f"{len(users)} annotators"
    )
    return project.pk, [user.username for user in users]


EARLIER = "earlier-"  # the usernames of the annotators who labelled before the run


def label_before(project, items: list, password: str, rng: random.Random) -> None:
    """Fill `items` with labels by earlier annotators, as the queue would have: a done assignment per slot and its
    comparison, the items' completed counts at their overlap."""
    from django.contrib.auth import get_user_model
    from django.db.models import F
    from django.utils import timezone

    from feedback_app.models import Assignment, Comparison, Membership, QueueItem
    from feedback_app.models.queue import AssignmentStatus

    users = get_user_model().objects.bulk_create(
        get_user_model()(username=f"{EARLIER}{n:02d}", password=password) for n in range(20)
    )
    Membership.objects.bulk_create(Membership(user=user, project=project, role="annotator") for user in users)
    now = timezone.now()
    slots = [(item, slot, user) for item in items for slot, user in enumerate(rng.sample(users, item.overlap))]
    assignments = Assignment.objects.bulk_create(
        (
            Assignment(item=item, annotator=user, slot=slot, status=AssignmentStatus.DONE, leased_until=now,
                       finished_at=now)
            for item, slot, user in slots
        ),
        batch_size=2000,
    )  # fmt: skip
    Comparison.objects.bulk_create(
        (
            Comparison(project=project, annotator=user, assignment=assignment, trajectory_a_id=item.trajectory_id,
                       trajectory_b_id=item.other_trajectory_id, choice=rng.choice(["a", "b", "tie", "both_bad"]),
                       strength=rng.choice([1, 2, 3]), client_token=uuid.uuid4(), seconds_spent=rng.uniform(2, 20))
            for (item, _, user), assignment in zip(slots, assignments, strict=True)
        ),
        batch_size=2000,
    )  # fmt: skip
    QueueItem.objects.filter(pk__in=[item.pk for item in items]).update(completed_count=F("overlap"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_gunicorn(args: argparse.Namespace, env: dict[str, str], port: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "gunicorn", "feedback_app.wsgi:application",
        "--bind", f"127.0.0.1:{port}",
        "--worker-class", "gthread", "--workers", str(args.workers), "--threads", str(args.threads),
        "--keep-alive", str(args.keep_alive), "--backlog", "2048", "--log-level", "warning",
    ]  # fmt: skip
    server = subprocess.Popen(command, env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit("gunicorn exited before it answered")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    sys.exit("gunicorn did not answer /healthz within 60 s")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(server: subprocess.Popen) -> float:
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    return sum(process_cpu_seconds(int(pid)) for pid in [server.pid, *children])


# The simulated annotators --------------------------------------------------------------------------------------------

FORM_ACTION = re.compile(r'<form id="compare-form" method="post" action="([^"]+)"')
CLIENT_TOKEN = re.compile(r'name="client_token" value="([0-9a-f-]+)"')
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class Submit:
    finished: float
    seconds: float
    status: int


@dataclass
class Annotator:
    username: str
    port: int
    project_pk: int
    think: float
    stop: threading.Event
    submits: list[Submit] = field(default_factory=list)
    cookies: dict[str, str] = field(default_factory=dict)
    error: str = ""
    queue_empty: bool = False

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items()), **(headers or {})}
        data = None
        if body is not None:
            data = urlencode(body)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        for attempt in range(2):  # a keep-alive connection the server closed is reopened once
            try:
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                text = response.read().decode()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if attempt:
                    raise
        for name, value in response.getheaders():
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                self.cookies[key] = rest.split(";", 1)[0]
        return response.status, text, response

    def run(self) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            self.log_in()
            status, page, _ = self.request("GET", f"/projects/{self.project_pk}/compare/")
            rng = random.Random(self.username)
            while not self.stop.is_set():
                action, token = FORM_ACTION.search(page), CLIENT_TOKEN.search(page)
                if action is None:
                    self.queue_empty = "Nothing left to compare" in page
                    if not self.queue_empty:
                        self.error = f"no form in the answer ({status}): {page[:200]!r}"
                    return
                time.sleep(self.think * rng.uniform(0.5, 1.5))
                body = {"choice": rng.choice(["left", "right", "tie", "both_bad"]), "strength": rng.choice("123"),
                        "rationale": "", "client_token": token.group(1)}  # fmt: skip
                headers = {"HX-Request": "true", "HX-Target": "workspace", "X-CSRFToken": self.cookies["csrftoken"]}
                started = time.perf_counter()
                status, page, _ = self.request("POST", action.group(1), body, headers)
                self.submits.append(Submit(time.perf_counter(), time.perf_counter() - started, status))
                if status not in (200, 409):
                    self.error = f"submit answered {status}: {page[:200]!r}"
                    return
        except Exception as exc:  # noqa: BLE001 - a benchmark thread reports whatever stopped it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.conn.close()

    def log_in(self) -> None:
        _, page, _ = self.request("GET", "/accounts/login/")
        form = {
            "username": self.username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": CSRF_FIELD.search(page).group(1),
        }
        status, _, response = self.request("POST", "/accounts/login/", form)
        if status != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(f"login of {self.username} failed with {status}")


# Checking and reporting ----------------------------------------------------------------------------------------------


def check_database(project_pk: int, overlap: int, successful: int) -> list[str]:
    """The invariants after the run: one stored label per successful submit, no item labelled beyond its overlap
    (the labels from before the run included)."""
    from django.db import connections
    from django.db.models import Count, F, Q

    from feedback_app.models import Assignment, Comparison, QueueItem
    from feedback_app.models.queue import AssignmentStatus

    connections.close_all()
    problems = []
    stored = Comparison.objects.filter(project_id=project_pk).count()
    during = Comparison.objects.filter(project_id=project_pk).exclude(annotator__username__startswith=EARLIER).count()
    if during != successful:
        problems.append(f"{during} comparisons stored during the run but {successful} submits succeeded")
    done = Q(assignments__status=AssignmentStatus.DONE)
    items = QueueItem.objects.filter(project_id=project_pk).annotate(done=Count("assignments", filter=done))
    pairs = Comparison.objects.filter(project_id=project_pk, is_current=True).values("trajectory_a", "trajectory_b")
    labelled_twice = Assignment.objects.filter(item__project_id=project_pk, status=AssignmentStatus.DONE)
    for count, what in [
        (items.filter(completed_count__gt=F("overlap")).count(), "items completed beyond their overlap"),
        (items.filter(done__gt=F("overlap")).count(), "items with more labelled slots than their overlap"),
        (items.exclude(done=F("completed_count")).count(), "items whose completed count differs from their slots"),
        (pairs.annotate(n=Count("pk")).filter(n__gt=overlap).count(), "pairs with more labels than the overlap"),
        (stored - labelled_twice.count(), "labels without a labelled slot (or slots without a label)"),
    ]:
        if count:
            problems.append(f"{count} {what}")
    return problems


def cpu_seconds(server: subprocess.Popen) -> tuple[float, float, float]:
    """CPU used so far by this process (the simulated annotators), gunicorn, and PostgreSQL."""
    return time.process_time(), server_cpu_seconds(server), postgres_cpu_seconds()


def postgres_cpu_seconds() -> float:
    """CPU of every PostgreSQL process on the machine (other databases' work included), from /proc."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() == "postgres":
                    total += process_cpu_seconds(int(proc.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return total


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # `kill` runs the cleanup too
    database_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    # Enough items for the labels a fast server could take in the whole run, with room to spare.
    expected_labels = args.annotators / (args.think_ms / 1000) * (args.warmup + args.duration + 30)
    items_wanted = int(expected_labels / args.overlap * 1.5) + PAIRS_PER_TASK

    fresh_database(database_url)
    data_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    env = server_environment(database_url, data_dir)
    setup_django(env)
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    call_command("collectstatic", verbosity=0, interactive=False)
    project_pk, usernames = seed(args, items_wanted)
    connections.close_all()

    port = args.port or free_port()
    server = start_gunicorn(args, env, port)
    try:
        stop = threading.Event()
        annotators = [Annotator(name, port, project_pk, args.think_ms / 1000, stop) for name in usernames]
        threads = [threading.Thread(target=a.run, daemon=True) for a in annotators]
        print(f"gunicorn gthread: {args.workers} workers × {args.threads} threads on 127.0.0.1:{port}; "
              f"{len(threads)} annotators thinking {args.think_ms:.0f} ms ± 50 % (logging in…)")  # fmt: skip
        for thread in threads:
            thread.start()
        started = time.perf_counter()
        # Logging in hashes each password (PBKDF2): wait until everyone has submitted once before the warm-up counts.
        while sum(1 for a in annotators if a.submits or a.error) < len(annotators):
            if time.perf_counter() - started > 300:
                sys.exit("the annotators did not all log in within 300 s")
            time.sleep(0.2)
        window_start = time.perf_counter() + args.warmup
        time.sleep(args.warmup)
        cpu_before = cpu_seconds(server)
        time.sleep(args.duration)
        window_end = time.perf_counter()
        cpu_client, cpu_server, cpu_postgres = (b - a for a, b in zip(cpu_before, cpu_seconds(server), strict=True))
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=30)

    errors = [f"{a.username}: {a.error}" for a in annotators if a.error]
    submits = [s for a in annotators for s in a.submits]
    window = [s for s in submits if window_start <= s.finished <= window_end]
    stored_in_window = [s for s in window if s.status == 200]
    latencies_ms = [s.seconds * 1000 for s in window]
    successful = sum(1 for s in submits if s.status == 200)
    seconds = window_end - window_start

    print()
    print(f"measured {seconds:.1f} s after a {args.warmup:.0f} s warm-up")
    print(f"labels/s sustained:        {len(stored_in_window) / seconds:8.1f}")
    if latencies_ms:
        print(f"submit-and-next p50:       {statistics.median(latencies_ms):8.1f} ms")
        print(f"submit-and-next p99:       {percentile(latencies_ms, 0.99):8.1f} ms")
        print(f"submit-and-next max:       {max(latencies_ms):8.1f} ms")
    print(f"lease lost (409) answers:  {sum(1 for s in window if s.status == 409):8d}")
    print(
        f"CPU, cores busy on average: gunicorn {cpu_server / seconds:.2f}, PostgreSQL {cpu_postgres / seconds:.2f} "
        f"(every database on the server), benchmark client {cpu_client / seconds:.2f} (of {os.cpu_count()} cores)"
    )
    print("Note: the simulated annotators run on this same machine and use its CPU too.")
    if any(a.queue_empty for a in annotators):
        print("warning: some annotators ran out of items; raise the item count for a longer run")
    problems = check_database(project_pk, args.overlap, successful) + errors[:10]
    print(f"stored labels = successful submits ({successful}); no slot over its overlap: "
          f"{'yes' if not problems else 'NO'}")  # fmt: skip
    for problem in problems:
        print("  problem:", problem)
    figures = {
        "settings": {
            "annotators": args.annotators,
            "think_ms": args.think_ms,
            "gunicorn_workers": args.workers,
            "gunicorn_threads": args.threads,
            "keep_alive_s": args.keep_alive,
            "labelled_before": args.labelled_before,
            "database": "PostgreSQL",
        },
        "measured_s": round(seconds, 2),
        "labels_per_s": round(len(stored_in_window) / seconds, 1),
        "p50_ms": round(statistics.median(latencies_ms), 1) if latencies_ms else None,
        "p99_ms": round(percentile(latencies_ms, 0.99), 1) if latencies_ms else None,
        "max_ms": round(max(latencies_ms), 1) if latencies_ms else None,
        "lease_lost_409": sum(1 for s in window if s.status == 409),
        "cores_busy": {
            "gunicorn": round(cpu_server / seconds, 2),
            "postgresql": round(cpu_postgres / seconds, 2),
            "client": round(cpu_client / seconds, 2),
        },
        "stored_equals_submitted": not problems,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")
    shutil.rmtree(data_dir, ignore_errors=True)
    if not args.keep_database:
        connections.close_all()
        drop_database(database_url)
    sys.exit(1 if problems else 0)


def drop_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parsed.path.lstrip("/")}" WITH (FORCE)')


if __name__ == "__main__":
    main()
