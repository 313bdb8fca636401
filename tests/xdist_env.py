"""Each test process its own data directory and broker, set before Django reads its settings.

`test.sh` loads this module as a plugin (``-p tests.xdist_env``), which pytest imports before pytest-django sets
Django up. Under pytest-xdist every process already has its own test database (pytest-django names it after the
process); with its own data directory (uploads, artifacts, the filesystem broker's folders, the SQLite file) and, on
Redis, its own database number, the web app's and the workers' tests run in any process without meeting another
process's files or Celery messages. The Celery workers that the tests start inherit both.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis's default number of databases; database 0 stays the configured one's


def isolate(worker: str, environ: dict[str, str]) -> None:
    """Point `environ`'s data directory and broker at ones of the test process `worker` ("gw0", "gw1", ...)."""
    number = int(worker.removeprefix("gw"))
    base = Path(environ.get("TANDEM_DATA_DIR") or Path(__file__).resolve().parents[1] / "var")
    data = base / worker
    data.mkdir(parents=True, exist_ok=True)
    if (base / "secret_key").exists() and not (data / "secret_key").exists():
        shutil.copy2(base / "secret_key", data / "secret_key")
    environ["TANDEM_DATA_DIR"] = str(data)
    environ.pop("CELERY_BROKER_FOLDER", None)  # the filesystem broker's folder follows the data directory
    broker = environ.get("CELERY_BROKER_URL", "")
    if broker.startswith(("redis://", "rediss://")):
        if number + 1 >= REDIS_DATABASES:
            raise RuntimeError(f"{worker}: Redis has {REDIS_DATABASES} databases; run fewer test processes")
        environ["CELERY_BROKER_URL"] = urlunsplit(urlsplit(broker)._replace(path=f"/{number + 1}"))


if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    isolate(worker, os.environ)
