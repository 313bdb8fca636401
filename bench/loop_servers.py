"""The Tandem that bench/loop.py talks to: gunicorn and a Celery worker started on a fresh data directory with
the embedded defaults, and stopped with their process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
