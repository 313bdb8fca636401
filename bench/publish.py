"""Run one bench and publish its result as a page of the docs.

    .venv/bin/python bench/publish.py dpo_balance
    .venv/bin/python bench/publish.py export_bench -- --rows 20000
    .venv/bin/python bench/publish.py --variant gpu memory_bench -- --device cuda

The bench runs as its own command line would (``.venv/bin/python bench/<name>.py [arguments]``), writing its JSON
where this script tells it. Its figures are then stored in ``docs/benchmarks/results/<name>.json`` together with
what the docs page needs to say where they come from: the command, the bench's own description (its docstring), the
date, the machine (CPU model, cores, memory, GPU, Python and torch versions) and the commit. `docs/hooks.py` renders
that file as ``benchmarks/<name>.md`` when the docs are built, so no figure on a benchmark page is typed by hand.
``--variant`` publishes a second result of the same bench beside the first (``<name>-<variant>.json``), for a run on
other hardware or at another setting. Where the checkout has no git (a copied tree), ``TANDEM_BENCH_COMMIT`` names the
commit it was copied from.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks" / "results"
# How each bench is told where to write its JSON; --out unless named here. Only benches that write JSON are listed.
OUT_FLAGS = {"tool_policy": "--json"}
TITLES = {
    "annotate_load": "Annotation throughput",
    "dpo_balance": "Step DPO's pair balancing",
    "export_bench": "Export throughput",
    "feedback_types": "Feedback types per annotator-minute",
    "fuzz_api": "REST API fuzzing",
    "import_bench": "Trajectory import throughput",
    "judge_oracle": "Judges against the oracle",
    "loop": "The feedback loop",
    "loop_seeds": "The feedback loop over several seeds",
    "memory_bench": "Memory at the shape of a 0.5 B model",
    "policy_bench": "Policy methods compared",
    "tool_policy": "The built-in tool-calling policy",
    "train_bench": "Training throughput",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=sorted(TITLES), help="The bench, by its file name under bench/.")
    parser.add_argument(
        "--variant",
        type=_variant,
        help="Publish as <bench>-<variant>.json, beside the bench's main result (a GPU run, say).",
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="After --: the bench's own arguments.")
    return parser.parse_args(argv)


def _variant(value: str) -> str:
    if not value.replace("_", "").isalnum() or not value.isascii():
        raise argparse.ArgumentTypeError("letters, digits and _ only")
    return value


def about(bench: str) -> str:
    """The first paragraph of the bench's docstring, in one line."""
    docstring = ast.get_docstring(ast.parse((ROOT / "bench" / f"{bench}.py").read_text())) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def machine() -> str:
    """The machine in words: CPU model and cores, memory, GPU where there is one, Python and torch versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [f"{cpu}, {os.cpu_count()} cores"]
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal"))
        parts.append(f"{kib / 2**20:.0f} GiB of memory")
    except (OSError, StopIteration, ValueError):
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        parts += [gpu, f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    except ImportError:
        parts.append(f"Python {platform.python_version()}")
    return ", ".join(parts)


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD")
    if not head:
        return os.environ.get("TANDEM_BENCH_COMMIT", "unknown")
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def publish(bench: str, arguments: list[str], variant: str | None = None) -> dict[str, Any]:
    arguments = [argument for argument in arguments if argument != "--"]
    command = shlex.join([".venv/bin/python", f"bench/{bench}.py", *arguments])
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / f"{bench}.json"
        flag = OUT_FLAGS.get(bench, "--out")
        done = subprocess.run([sys.executable, str(ROOT / "bench" / f"{bench}.py"), *arguments, flag, str(out)])
        if done.returncode != 0 or not out.exists():
            sys.exit(f"{bench} failed (exit status {done.returncode}): nothing was published")
        figures = json.loads(out.read_text())
    name = f"{bench}-{variant}" if variant else bench
    result = {
        "bench": bench,
        "title": f"{TITLES[bench]} ({variant})" if variant else TITLES[bench],
        "about": about(bench),
        "run": {
            "command": command,
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "machine": machine(),
            "commit": commit(),
        },
        "figures": figures,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    publish(args.bench, args.arguments, args.variant)
    name = f"{args.bench}-{args.variant}" if args.variant else args.bench
    print(f"wrote {RESULTS.relative_to(ROOT) / (name + '.json')}; `mkdocs build` renders it")


if __name__ == "__main__":
    main()
