"""Export throughput and server memory: seed many comparisons into PostgreSQL, stream the `preference` export
through a real gunicorn server, and report rows per second and the worker's peak RSS.

    .venv/bin/python bench/export_bench.py --comparisons 1000000
    .venv/bin/python bench/export_bench.py --comparisons 20000 --formats jsonl,parquet --aggregates majority,all

It works in its own database (`--database`, default tandem_exports_bench, created on the server of
`--server-url`); when the data there was seeded with other settings it is dropped and seeded again with COPY
(about two minutes for a million comparisons on 2 cores). Each task has `--trajectories-per-task` trajectories
(default 4) of 2 to 6 real gridworld steps, every pair of them is compared by `--labels-per-pair` annotators (default
2) who agree 80 % of the time, and 10 % of first judgements are ties or both-bad. With the defaults,
`aggregate=majority` exports about 0.36 rows per comparison (a 1-1 split is no row) and `aggregate=all` about 0.85.

The server is gunicorn as docker-compose runs it (gthread workers, DEBUG off), with one worker so that its
`VmHWM` (peak resident memory, from /proc/<pid>/status) is the memory one export costs. The export is read by curl,
so the client costs the machine little. Besides wall-clock rates the script prints the worker's own CPU time per
export (utime + stime from /proc/<pid>/stat), which says what the export costs when other work shares the cores;
the load average is printed beside it for the same reason.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROJECT_SLUG = "export-bench"
ANNOTATORS = 6
AGREE = 0.8
FIRST_CHOICES = ["a"] * 45 + ["b"] * 45 + ["tie"] * 5 + ["both_bad"] * 5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comparisons", type=int, default=1_000_000, help="How many comparisons to seed.")
    parser.add_argument("--server-url", default="postgres://tandem:tandem@127.0.0.1:5432", help="PostgreSQL server.")
    parser.add_argument("--database", default="tandem_exports_bench", help="Bench database (its name has 'bench').")
    parser.add_argument("--trajectories-per-task", type=int, default=4, help="Every pair of them is compared.")
    parser.add_argument("--labels-per-pair", type=int, default=2, help="Annotators per pair (1 to 6).")
    parser.add_argument("--min-steps", type=int, default=2, help="Fewest steps per trajectory.")
    parser.add_argument("--max-steps", type=int, default=6, help="Most steps per trajectory.")
    parser.add_argument("--formats", default="jsonl", help="Comma-separated: jsonl, parquet.")
    parser.add_argument("--aggregates", default="majority", help="Comma-separated: majority, drop, all.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker.")
    parser.add_argument("--out", default="var/bench/export_bench.json", help="Where the figures go (JSON).")
    args = parser.parse_args()
    if "bench" not in args.database:
        parser.error("--database must contain 'bench': the script drops and recreates it.")
    if not 1 <= args.min_steps <= args.max_steps:
        parser.error("need 1 <= --min-steps <= --max-steps")
    if not 1 <= args.labels_per_pair <= ANNOTATORS or args.trajectories_per_task < 2:
        parser.error(f"need 1 <= --labels-per-pair <= {ANNOTATORS} and --trajectories-per-task >= 2")
    return args


# --- database ------------------------------------------------------------------------------------------------------


def ensure_database(args: argparse.Namespace, seed_key: str) -> bool:
    """Create the bench database if needed; drop it first if it holds data seeded with other settings. Returns
    whether it must be seeded."""
    import psycopg

    with psycopg.connect(f"{args.server_url}/postgres", autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [args.database]).fetchone()
        if exists:
            try:
                with psycopg.connect(f"{args.server_url}/{args.database}") as bench:
                    row = bench.execute(
                        "SELECT description FROM feedback_app_project WHERE slug = %s", [PROJECT_SLUG]
                    ).fetchone()
            except psycopg.Error:
                row = None
            if row and row[0] == seed_key:
                return False
            print(f"Dropping {args.database} (seeded with other settings)…", flush=True)
            admin.execute(f'DROP DATABASE "{args.database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    return True


def episode_pool(size: int, max_steps: int) -> list[list[tuple[str, str, str, str]]]:
    """Real gridworld episodes (observation, reasoning, action, the observation after it), reused cyclically so texts
    are realistic."""
    from reward_models.envs.gridworld import ACTIONS, GridWorld
    from reward_models.policy.bootstrap import goal_reasoning

    env, rng, pool = GridWorld(), random.Random(0), []
    while len(pool) < size:
        observation = env.reset(env.make_task(len(pool) + 10))
        steps = []
        for _ in range(max_steps):
            action = rng.choice(ACTIONS)
            result = env.step(action)
            steps.append((observation, goal_reasoning(observation), action, result.observation))
            if result.done:
                break
            observation = result.observation
        if len(steps) == max_steps:
            pool.append(steps)
    return pool


def seed(args: argparse.Namespace, seed_key: str) -> None:
    """Users, a project, tasks, trajectories, steps and comparisons, bulk-loaded with COPY."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from feedback_app.models import EnvironmentSpec, Membership, PolicyVersion, Project
    from reward_models.policy.turns import format_decision

    started = time.monotonic()
    rng = random.Random(1)
    per_task = args.trajectories_per_task
    pairs_per_task = per_task * (per_task - 1) // 2
    tasks = -(-args.comparisons // (args.labels_per_pair * pairs_per_task))
    pool = episode_pool(500, args.max_steps)
    now = datetime.now(UTC)

    with transaction.atomic():
        spec = EnvironmentSpec.objects.create(
            name="gridworld-bench", dotted_path="reward_models.envs.gridworld.GridWorld"
        )
        project = Project.objects.create(name="Export bench", slug=PROJECT_SLUG, environment=spec, overlap=2)
        project.description = seed_key
        project.save(update_fields=["description"])
        policy = PolicyVersion.objects.create(project=project, name="bench-policy", kind="external")
        users = get_user_model()
        annotators = [users.objects.create_user(f"bench-annotator-{i}") for i in range(ANNOTATORS)]
        researcher = users.objects.create_user("bench-researcher")
        Membership.objects.bulk_create(
            [Membership(user=user, project=project, role="annotator") for user in annotators]
            + [Membership(user=researcher, project=project, role="researcher")]
        )
        raw = connection.cursor().cursor  # the psycopg cursor, for COPY
        with raw.copy(
            "COPY feedback_app_task (id, project_id, instruction, seed, spec, split, external_id, created_at) "
            "FROM STDIN"
        ) as copy:
            for task in range(1, tasks + 1):
                copy.write_row(
                    (task, project.pk, "reach the goal G", task, json.dumps({"seed": task}), "review", None, now)
                )
        trajectory_id = step_id = 0
        with raw.copy(
            "COPY feedback_app_trajectory (id, project_id, task_id, policy_version_id, source, parent_id, "
            "branch_step_index, rollout_run_id, sample_index, external_id, num_steps, total_env_reward, success, "
            "outcome_return, oracle, metadata, prompt, tools, created_at) FROM STDIN"
        ) as trajectories:
            lengths = []
            for task in range(1, tasks + 1):
                for sample in range(per_task):
                    trajectory_id += 1
                    n = rng.randint(args.min_steps, args.max_steps)
                    lengths.append(n)
                    first_observation = pool[trajectory_id % len(pool)][0][0]
                    prompt = [
                        {"role": "system", "content": "reach the goal G"},
                        {"role": "user", "content": first_observation},
                    ]
                    trajectories.write_row(
                        (trajectory_id, project.pk, task, policy.pk, "policy", None, None, None, sample, None, n)
                        + (0.0, None, None, "{}", "{}", json.dumps(prompt), "[]", now)
                    )
        with raw.copy(
            "COPY feedback_app_step (id, trajectory_id, index, observation, reasoning, action, tool_calls, "
            "env_reward, logprob, media, render, done, message, replies) FROM STDIN"
        ) as steps:
            for trajectory, n in enumerate(lengths, start=1):
                episode = pool[trajectory % len(pool)]
                for index in range(n):
                    step_id += 1
                    observation, reasoning, action, after = episode[index]
                    message = {"role": "assistant", "content": format_decision(reasoning, action)}
                    replies = [{"role": "user", "content": after}]  # what the environment answered, as in rollouts
                    steps.write_row(
                        (step_id, trajectory, index, observation, reasoning, action, "[]", 0.0, None, "[]", "{}")
                        + (index == n - 1, json.dumps(message), json.dumps(replies))
                    )
        comparison_id = 0
        with raw.copy(
            "COPY feedback_app_comparison (id, project_id, annotator_id, assignment_id, revision, supersedes_id, "
            "is_current, client_token, seconds_spent, query_strategy, created_at, trajectory_a_id, trajectory_b_id, "
            "choice, strength, rationale, displayed_order) FROM STDIN"
        ) as comparisons:
            for task in range(tasks):
                first = task * per_task + 1
                for a in range(first, first + per_task):
                    for b in range(a + 1, first + per_task):
                        choice = rng.choice(FIRST_CHOICES)
                        who = rng.sample(annotators, args.labels_per_pair)
                        for k, annotator in enumerate(who):
                            if comparison_id == args.comparisons:
                                break
                            if k > 0 and rng.random() > AGREE:
                                choice = rng.choice([c for c in ("a", "b", "tie", "both_bad") if c != choice])
                            comparison_id += 1
                            comparisons.write_row(
                                (comparison_id, project.pk, annotator.pk, None, 1, None, True, None, 5.0, "random")
                                + (
                                    now,
                                    a,
                                    b,
                                    choice,
                                    rng.randint(1, 3),
                                    "closer to the goal",
                                    rng.choice(["ab", "ba"]),
                                )
                            )
        for table in ("task", "trajectory", "step", "comparison"):
            raw.execute(
                f"SELECT setval(pg_get_serial_sequence('feedback_app_{table}', 'id'), "
                f"(SELECT max(id) FROM feedback_app_{table}))"
            )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(
        f"Seeded {comparison_id:,} comparisons over {trajectory_id:,} trajectories ({step_id:,} steps, {tasks:,} "
        f"tasks) in {time.monotonic() - started:.0f} s.",
        flush=True,
    )


def session_cookie() -> tuple[int, str]:
    """The bench project's id and a logged-in session for its researcher."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model

    from feedback_app.models import Project

    researcher = get_user_model().objects.get(username="bench-researcher")
    # As Django's test client logs in: the configured session engine and the first authentication backend.
    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(researcher.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = researcher.get_session_auth_hash()
    session.create()
    return Project.objects.get(slug=PROJECT_SLUG).pk, f"sessionid={session.session_key}"


# --- server --------------------------------------------------------------------------------------------------------


def start_server(args: argparse.Namespace, database_url: str, log_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DEBUG": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "TANDEM_API_THROTTLE_USER": "100000/hour",
    }
    command = [sys.executable, "-m", "gunicorn", "feedback_app.wsgi", "--bind", f"127.0.0.1:{args.port}"]
    command += ["--workers", "1", "--threads", str(args.threads), "--timeout", "120", "--no-control-socket"]
    with log_path.open("w") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited:\n{log_path.read_text()}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=2)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return server
        except OSError:
            time.sleep(0.3)
    server.kill()
    raise RuntimeError(f"gunicorn did not answer /healthz within 60 s:\n{log_path.read_text()}")


def worker_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def stream_export(args, project_pk: int, cookie: str, query: dict, sample_pid: int) -> dict:
    """GET the export with curl (so that reading 1.5 GB costs this machine's 2 cores next to nothing), counting lines
    (JSONL rows) and bytes as they arrive and sampling the worker's RSS."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(memory_kib(sample_pid, "VmRSS"))
            stop.wait(0.25)

    url = f"http://127.0.0.1:{args.port}/api/projects/{project_pk}/exports/preference?{urlencode(query)}"
    command = ["curl", "--silent", "--show-error", "--fail", "--header", f"Cookie: {cookie}", "--output", "-", url]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        started = time.monotonic()
        curl = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        first_byte = None
        total = lines = 0
        head = b""
        tail = bytearray()  # the last few MiB, for the Parquet footer and the last JSONL row
        while chunk := curl.stdout.read(1 << 20):
            if first_byte is None:
                first_byte = time.monotonic() - started
                head = chunk[:20000]
            total += len(chunk)
            lines += chunk.count(b"\n")
            tail += chunk
            if len(tail) > 16 << 20:
                del tail[: -(8 << 20)]
        if curl.wait() != 0:
            raise RuntimeError(f"curl failed: {curl.stderr.read().decode()}")
        seconds = time.monotonic() - started
    finally:
        stop.set()
        sampler.join()
    result = {"bytes": total, "seconds": seconds, "first_byte": first_byte or seconds, "rss_samples": samples}
    if query.get("format", "jsonl") == "jsonl":
        result["rows"] = lines
        if lines:  # spot-check that what came back is whole rows with the documented columns
            last_line = bytes(tail).rstrip(b"\n").rsplit(b"\n", 1)[-1]
            for row in (json.loads(head.split(b"\n", 1)[0]), json.loads(last_line)):
                assert {"prompt", "chosen", "rejected", "margin", "agreement"} <= row.keys(), row.keys()
    else:
        # The footer (its length sits in the last 8 bytes) holds the row count; the magic bytes make it a file.
        footer_length = int.from_bytes(tail[-8:-4], "little")
        footer = b"PAR1" + bytes(tail[-8 - footer_length :])
        result["rows"] = pq.ParquetFile(io.BytesIO(footer)).metadata.num_rows
    return result


def python_speed() -> float:
    """Seconds for a ten-million-step Python loop: a shared machine's speed can drift by a factor of two or more from
    day to day, and the export is Python-bound, so figures from different days compare only beside this."""
    started = time.perf_counter()
    total = 0
    for step in range(10_000_000):
        total += step
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # `kill` runs the cleanup too
    database_url = f"{args.server_url}/{args.database}"
    os.environ["DATABASE_URL"] = database_url
    # The server checks the session this process signs, so both use this key.
    os.environ["SECRET_KEY"] = "export-bench-not-a-secret"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "feedback_app.settings")
    seed_key = json.dumps(
        {
            "comparisons": args.comparisons,
            "steps": [args.min_steps, args.max_steps],
            "trajectories_per_task": args.trajectories_per_task,
            "labels_per_pair": args.labels_per_pair,
            "version": 1,
        },
        sort_keys=True,
    )
    must_seed = ensure_database(args, seed_key)

    import django
    from django.core.management import call_command

    django.setup()
    if must_seed:
        call_command("migrate", verbosity=0)
        seed(args, seed_key)
    else:
        print(f"Reusing {args.database}: already seeded with {args.comparisons:,} comparisons.", flush=True)
    project_pk, cookie = session_cookie()
    from django.db import connection

    connection.close()

    log_path = ROOT / "var" / "export-bench-gunicorn.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    server = start_server(args, database_url, log_path)
    try:
        [worker] = worker_pids(server.pid)
        # Warm up (imports, first queries) on an export with no rows, then measure from that baseline.
        stream_export(args, project_pk, cookie, {"annotators": "999999999"}, worker)
        baseline = memory_kib(worker, "VmRSS")
        print(
            f"\n{args.comparisons:,} comparisons, {args.trajectories_per_task} trajectories per task, "
            f"{args.labels_per_pair} labels per pair. Worker {worker} after warm-up: RSS {baseline / 1024:.0f} MiB. "
            f"Machine: a 10M-step Python loop takes {python_speed():.2f} s.",
            flush=True,
        )
        print(
            f"{'format':8} {'aggregate':9} {'rows':>9} {'MiB':>7} {'1st byte':>8} {'seconds':>8} {'rows/s':>7} "
            f"{'comparisons/s':>13} {'worker CPU':>10} {'rows/CPU-s':>10} {'peak RSS':>9} {'load':>5}"
        )
        exports = []
        for fmt in args.formats.split(","):
            for aggregate in args.aggregates.split(","):
                cpu_before = cpu_seconds(worker)
                result = stream_export(args, project_pk, cookie, {"format": fmt, "aggregate": aggregate}, worker)
                cpu = cpu_seconds(worker) - cpu_before
                rows, seconds = result["rows"], result["seconds"]
                peak = max(result["rss_samples"], default=0)
                print(
                    f"{fmt:8} {aggregate:9} {rows:>9} {result['bytes'] / 2**20:7.1f} {result['first_byte']:7.1f}s "
                    f"{seconds:7.1f}s {rows / seconds:7.0f} {args.comparisons / seconds:13.0f} {cpu:9.1f}s "
                    f"{rows / cpu:10.0f} {peak / 1024:6.0f}MiB {os.getloadavg()[0]:5.1f}",
                    flush=True,
                )
                exports.append(
                    {
                        "format": fmt,
                        "aggregate": aggregate,
                        "rows": rows,
                        "MiB": round(result["bytes"] / 2**20, 1),
                        "first_byte_s": round(result["first_byte"], 2),
                        "seconds": round(seconds, 2),
                        "rows_per_s": round(rows / seconds),
                        "comparisons_per_s": round(args.comparisons / seconds),
                        "worker_cpu_s": round(cpu, 2),
                        "peak_rss_MiB": round(peak / 1024),
                    }
                )
        peak_all = memory_kib(worker, "VmHWM") / 1024
        print(f"\nWorker peak RSS (VmHWM) over all exports: {peak_all:.0f} MiB")
        figures = {
            "comparisons": args.comparisons,
            "trajectories_per_task": args.trajectories_per_task,
            "labels_per_pair": args.labels_per_pair,
            "worker_rss_after_warm_up_MiB": round(baseline / 1024),
            "worker_peak_rss_MiB": round(peak_all),
            "exports": exports,
        }
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {out}")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
