"""The long API fuzz run: every operation of the OpenAPI schema, as a researcher and as an annotator, with data that
fits the schema and data that does not, against existing and generated ids (tests/feedback_app/api/test_fuzz.py
with many more cases than the suite runs). Prints the cases, status codes and failures per role and writes them as
JSON.

    .venv/bin/python bench/fuzz_api.py                       # about 10,000 cases per role
    .venv/bin/python bench/fuzz_api.py --examples 5          # a quick run
    DATABASE_URL=postgres://... .venv/bin/python bench/fuzz_api.py

It runs on the database the test suite uses (SQLite by default; PostgreSQL with DATABASE_URL, as CI).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=45, help="Cases per operation, mode and kind of id.")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "fuzz_api.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = out.with_suffix(".roles.json")
    report.unlink(missing_ok=True)
    data_dir = Path(os.environ.get("TANDEM_DATA_DIR", ROOT / "var" / "test"))
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TANDEM_DATA_DIR": str(data_dir),
        "TANDEM_FUZZ_EXAMPLES": str(args.examples),
        "TANDEM_FUZZ_REPORT": str(report),
        "HF_HUB_OFFLINE": "1",
    }
    subprocess.run([sys.executable, "-m", "feedback_app.secret_key"], cwd=ROOT, env=env, check=True)
    started = time.monotonic()
    test = "tests/feedback_app/api/test_fuzz.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", test, "-p", "no:cacheprovider", "-q", "-n", "0", "-o", "log_level=ERROR"],
        cwd=ROOT,
        env=env,
    )
    roles = json.loads(report.read_text()) if report.exists() else {}
    report.unlink(missing_ok=True)
    result = {
        "bench": "fuzz_api",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite",
        "examples": args.examples,
        "wall_seconds": round(time.monotonic() - started, 1),
        "roles": {
            role: {
                "cases": found["cases"],
                "statuses": found["statuses"],
                "server_errors": sum(count for code, count in found["statuses"].items() if int(code) >= 500),
                "failures": len(found["failures"]),
                "first_failures": found["failures"][:20],
            }
            for role, found in roles.items()
        },
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'role':<12}{'cases':>8}{'5xx':>6}{'failed checks':>15}  statuses")
    for role, found in result["roles"].items():
        statuses = ", ".join(f"{code}: {count}" for code, count in sorted(found["statuses"].items()))
        print(f"{role:<12}{found['cases']:>8}{found['server_errors']:>6}{found['failures']:>15}  {statuses}")
    print(f"\n{result['wall_seconds']:.0f} s on {result['database']}; written to {out}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
