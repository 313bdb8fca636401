"""Benchmark the trajectory import endpoint end to end: a real gunicorn, a real database, one streamed POST.

It migrates the database named by DATABASE_URL, makes a fresh project, a researcher and an API token, writes
N multi-step trajectories as JSON Lines, starts gunicorn (one sync worker), POSTs the file to
/api/projects/<id>/trajectories/import, and prints trajectories/s, steps/s and the worker's peak RSS (VmHWM). Then it
posts the same file again, which must store nothing (the idempotent retry), and times that too. The figures are also
written as JSON (`--out`).

    DATABASE_URL=postgres://tandem:tandem@127.0.0.1:5432/tandem_bench .venv/bin/python bench/import_bench.py
    .venv/bin/python bench/import_bench.py --rows 2000          # a quick check (SQLite in TANDEM_DATA_DIR)

The database must exist (the script runs the migrations). Each run adds a project to it: use a database that is
only for benchmarking, and drop it afterwards.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="Trajectories to import.")
    parser.add_argument("--steps", type=int, default=5, help="Steps per trajectory.")
    parser.add_argument("--tasks", type=int, default=1000, help="Distinct tasks the trajectories share.")
    parser.add_argument("--port", type=int, default=0, help="Port for gunicorn; 0 picks a free one.")
    parser.add_argument("--timeout", type=int, default=3600, help="gunicorn's worker timeout, in seconds.")
    parser.add_argument("--no-retry", action="store_true", help="Skip the second, idempotent POST.")
    parser.add_argument(
        "--out", default=str(ROOT / "var" / "bench" / "import_bench.json"), help="The figures as JSON."
    )
    return parser.parse_args()


def write_rows(path: Path, rows: int, steps: int, tasks: int, run_id: str) -> None:
    """Gridworld-like episodes with reasoning, an action, a tool call on every other step, rewards and logprobs:
    about 1 KB a row, so 100,000 five-step rows fit the default 100 MiB limit."""
    rng = random.Random(0)
    actions = ["up", "down", "left", "right"]
    with path.open("w") as out:
        for i in range(rows):
            row = {
                "external_id": f"{run_id}-ep-{i}",
                "task": {"external_id": f"task-{i % tasks}", "instruction": f"reach the goal G (map {i % tasks})"},
                "policy": f"bench-agent-v{i % 3}",
                "steps": [
                    {
                        "observation": f"#..G|.A..|..#.|{j}",
                        "reasoning": f"the goal is up and right ({j})",
                        "action": rng.choice(actions),
                        **({"tool_calls": [{"name": "look", "arguments": {"radius": j}}]} if j % 2 else {}),
                        "reward": 1.0 if j == steps - 1 else 0.0,
                        "logprob": round(-rng.random(), 3),
                    }
                    for j in range(steps)
                ],
                "outcome": {"success": rng.random() < 0.5, "return": round(rng.random(), 3)},
                "metadata": {"bench": True},
            }
            out.write(json.dumps(row) + "\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(port: int, server: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("gunicorn exited before it answered")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer /healthz in time")


def worker_pids(master_pid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(master_pid):
            pids.append(int(status.parent.name))
    return pids


def peak_rss_mib(master_pid: int) -> float:
    """The highest VmHWM (peak resident set) among the gunicorn master's workers, in MiB."""
    peaks = []
    for pid in worker_pids(master_pid):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return max(peaks, default=float("nan"))


def cpu_seconds(master_pid: int) -> float:
    """User + system CPU time of the workers so far: a figure that a busy machine disturbs less than wall time."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in worker_pids(master_pid):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def post_file(port: int, path: str, body: Path, key: str) -> tuple[int, dict, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=None)
    started = time.perf_counter()
    with body.open("rb") as stream:
        connection.request(
            "POST",
            path,
            body=stream,
            headers={
                "Content-Type": "application/x-ndjson",
                "Content-Length": str(body.stat().st_size),
                "Authorization": f"Bearer {key}",
            },
        )
        response = connection.getresponse()
        payload = response.read()
    elapsed = time.perf_counter() - started
    try:
        answer = json.loads(payload)
    except ValueError:
        answer = {"body": payload[:500].decode(errors="replace")}
    return response.status, answer, elapsed


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # `kill` runs the cleanup too
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "feedback_app.settings",
        "DEBUG": "false",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "import-bench-" + uuid.uuid4().hex),
        "TANDEM_API_THROTTLE_IMPORTS": "1000/hour",
    }
    work = Path(tempfile.mkdtemp(prefix="tandem-import-bench-"))
    env["STATIC_ROOT"] = str(work)  # an empty folder: the API serves no static files
    body = work / "rows.jsonl"
    run_id = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    write_rows(body, args.rows, args.steps, args.tasks, run_id)
    size = body.stat().st_size
    # The server must accept this file; the default limit (100 MiB) stays in force for everything else.
    env["TANDEM_IMPORT_MAX_BYTES"] = str(max(size, 100 * 2**20))
    print(
        f"wrote {args.rows} trajectories × {args.steps} steps: {size / 2**20:.1f} MiB JSONL "
        f"in {time.perf_counter() - started:.1f} s"
    )

    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection

    from feedback_app.models import ApiToken, EnvironmentSpec, Membership, Project, Step, Trajectory

    spec, _ = EnvironmentSpec.objects.get_or_create(
        name="gridworld", defaults={"dotted_path": "reward_models.envs.gridworld.GridWorld"}
    )
    project = Project.objects.create(name=f"Import bench {run_id}", environment=spec)
    user = get_user_model().objects.create_user(username=f"bench-{run_id}")
    Membership.objects.create(user=user, project=project, role="researcher")
    _, key = ApiToken.issue(user, "import bench")
    connection.close()
    print(f"database: {connection.vendor} ({connection.settings_dict['NAME']}), project {project.pk}")

    port = args.port or free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "feedback_app.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--timeout",
            str(args.timeout),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_for(port, server)
        url = f"/api/projects/{project.pk}/trajectories/import"
        cpu_before = cpu_seconds(server.pid)
        status, answer, elapsed = post_file(port, url, body, key)
        rss, cpu = peak_rss_mib(server.pid), cpu_seconds(server.pid) - cpu_before
        print(f"first import: HTTP {status} {answer} in {elapsed:.1f} s (server worker CPU {cpu:.1f} s)")
        if status != 200:
            raise SystemExit(1)
        stored = Trajectory.objects.filter(project=project).count()
        steps = Step.objects.filter(trajectory__project=project).count()
        assert stored == args.rows and steps == args.rows * args.steps, (stored, steps)
        figures = {
            "database": connection.vendor,
            "trajectories": args.rows,
            "steps_per_trajectory": args.steps,
            "tasks": args.tasks,
            "file_mib": round(size / 2**20, 1),
            "first_import": {
                "seconds": round(elapsed, 2),
                "trajectories_per_second": round(args.rows / elapsed),
                "steps_per_second": round(steps / elapsed),
                "worker_cpu_seconds": round(cpu, 1),
                "worker_peak_rss_mib": round(rss),
            },
        }
        print(
            f"  {args.rows / elapsed:,.0f} trajectories/s, {steps / elapsed:,.0f} steps/s, "
            f"{size / 2**20 / elapsed:.1f} MiB/s; server worker peak RSS {rss:.0f} MiB"
        )
        if not args.no_retry:
            cpu_before = cpu_seconds(server.pid)
            status, answer, elapsed = post_file(port, url, body, key)
            cpu = cpu_seconds(server.pid) - cpu_before
            print(
                f"retried import (idempotent): HTTP {status} {answer} in {elapsed:.1f} s (CPU {cpu:.1f} s), "
                f"{args.rows / elapsed:,.0f} rows/s checked; peak RSS {peak_rss_mib(server.pid):.0f} MiB"
            )
            assert answer.get("created") == 0 and answer.get("skipped") == args.rows, answer
            figures["retried_import"] = {
                "seconds": round(elapsed, 2),
                "rows_checked_per_second": round(args.rows / elapsed),
                "worker_cpu_seconds": round(cpu, 1),
            }
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {out}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        body.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
