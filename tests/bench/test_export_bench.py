"""bench/export_bench.py end to end at a tiny size, so the benchmark cannot break unseen (a change to how the server
reads sessions, for one, would refuse the bench's login). Its figures are the bench's business, not this test's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "export_bench.py"
DATABASE = "tandem_exports_bench_smoke"


def test_the_export_bench_seeds_serves_and_measures_every_format_and_aggregation(tmp_path, postgres_server):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, str(BENCH), "--comparisons", "240", "--database", DATABASE]
    command += ["--server-url", postgres_server, "--port", str(port)]
    command += ["--formats", "jsonl,parquet", "--aggregates", "majority,all"]
    command += ["--out", str(tmp_path / "figures.json")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        table = {
            tuple(line.split()[:2]): int(line.split()[2])
            for line in done.stdout.splitlines()
            if line.split()[:1] in (["jsonl"], ["parquet"])
        }
        assert table.keys() == {("jsonl", "majority"), ("jsonl", "all"), ("parquet", "majority"), ("parquet", "all")}
        # Two annotators per pair: `all` gives a row per label that picks a side, `majority` one per agreeing pair.
        assert 0 < table[("jsonl", "majority")] < table[("jsonl", "all")] <= 240
        assert table[("parquet", "majority")] == table[("jsonl", "majority")]
        assert table[("parquet", "all")] == table[("jsonl", "all")]
        assert "Worker peak RSS" in done.stdout and "10M-step Python loop takes" in done.stdout
        figures = json.loads((tmp_path / "figures.json").read_text())
        assert {(e["format"], e["aggregate"]): e["rows"] for e in figures["exports"]} == table
        assert figures["comparisons"] == 240 and figures["worker_peak_rss_MiB"] > 0
    finally:
        import psycopg

        with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
