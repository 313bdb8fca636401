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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://tandem:tandem@127.0.0.1:5432/tandem_bench"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the annotate_load_* modules beside it

from annotate_load_annotators import Annotator  # noqa: E402
from annotate_load_database import (  # noqa: E402
    PAIRS_PER_TASK,
    check_database,
    drop_database,
    fresh_database,
    seed,
)


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


# Checking and reporting ----------------------------------------------------------------------------------------------


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


if __name__ == "__main__":
    main()
