"""bench/annotate_load.py end to end at a tiny size (gunicorn on PostgreSQL, four annotators for three seconds), so
the annotation-throughput benchmark cannot break unseen. Its figures are the bench's business, not this test's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "annotate_load.py"
DATABASE = "tandem_annotate_bench_smoke"


def test_the_annotate_bench_labels_through_gunicorn_and_checks_what_was_stored(tmp_path, postgres_server):
    env = {**os.environ, "DATABASE_URL": f"{postgres_server}/{DATABASE}"}
    command = [sys.executable, str(BENCH), "--annotators", "4", "--think-ms", "100", "--warmup", "1"]
    command += ["--duration", "3", "--labelled-before", "60", "--out", str(tmp_path / "figures.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "(30 labelled before the run)" in done.stdout  # 60 labels at the default overlap of 2
    sustained = float(re.search(r"labels/s sustained:\s+([\d.]+)", done.stdout).group(1))
    assert sustained > 0
    assert "stored labels = successful submits" in done.stdout and "no slot over its overlap: yes" in done.stdout
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["labels_per_s"] == sustained and figures["stored_equals_submitted"] is True
    assert figures["settings"]["annotators"] == 4 and figures["p99_ms"] >= figures["p50_ms"] > 0

    import psycopg

    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as admin:
        left = admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [DATABASE]).fetchone()[0]
    assert left == 0  # the bench drops its database
