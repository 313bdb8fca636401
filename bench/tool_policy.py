"""Reproduce the shipped tool-calling policy: train it again from its config and seed, and compare with what ships.

The shipped weights (``reward_models/policy/weights/toolshop``) are made by ``python -m
reward_models.policy.tool_bootstrap --use_shipped false`` with the default config. This bench runs that training
again in a temporary directory, then prints and writes (``--json``) the held-out success of both, greedy and sampled,
with standard errors, the success curve during training, the training time, and the largest difference between the
two sets of weights (zero when torch gives the same numbers on this machine with the same thread count).

    python bench/tool_policy.py --json var/bench/tool_policy.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from reward_models.policy import tool_bootstrap


def max_weight_difference(first: Path, second: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[name].float() - b[name].float()).abs().max()) for name in a)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="Write the results here.")
    parser.add_argument("--num_threads", type=int, default=0, help="torch threads (default: the shipped run's).")
    args = parser.parse_args(argv)
    shipped = tool_bootstrap.shipped_metrics()
    if shipped is None:
        raise SystemExit(f"no shipped policy in {tool_bootstrap.SHIPPED_DIR}")
    config = tool_bootstrap.ToolBootstrapConfig(**shipped["config"])
    with tempfile.TemporaryDirectory() as work:
        config = replace(
            config,
            output_dir=str(Path(work) / "policy"),
            use_shipped=False,
            num_threads=args.num_threads or config.num_threads,
        )
        started = time.monotonic()
        again = tool_bootstrap.main(config)
        difference = max_weight_difference(tool_bootstrap.SHIPPED_DIR, Path(config.output_dir))
    keys = ("greedy_success", "greedy_stderr", "sampled_success", "sampled_stderr", "train_seconds")
    result = {
        "bench": "tool_policy",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
        "num_threads": config.num_threads,
        "parameters": again["parameters"],
        "shipped": {key: shipped[key] for key in keys},
        "reproduced": {key: again[key] for key in keys},
        "success_curve": again["success_curve"],
        "max_weight_difference": difference,
        "wall_seconds": time.monotonic() - started,
    }
    print(f"{'':12} {'greedy':>16} {'sampled':>16} {'train s':>8}")
    for name in ("shipped", "reproduced"):
        row = result[name]
        print(
            f"{name:12} {row['greedy_success']:>9.3f} ± {row['greedy_stderr']:.3f} "
            f"{row['sampled_success']:>9.3f} ± {row['sampled_stderr']:.3f} {row['train_seconds']:>8.0f}"
        )
    print(f"largest weight difference: {difference:.3g}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
