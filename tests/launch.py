"""Launching a pipeline's command line as a researcher would, including across several processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

TRACEBACK = "Traceback (most recent call last):"
ROOT = Path(__file__).resolve().parents[1]


def offline_env() -> dict[str, str]:
    """The environment for a one-process command line: offline, with one thread and no tokenizer workers."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def flag_arguments(flags: dict[str, Any]) -> list[str]:
    """`--name value` for each of `flags`, in their order, as a pipeline's command line takes them."""
    return [part for name, value in flags.items() for part in (f"--{name}", str(value))]


def command_help(module: str) -> str:
    """What `python -m module --help` prints."""
    command = [sys.executable, "-m", module, "--help"]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=offline_env(), check=True).stdout


def run_command(module: str, flags: dict[str, Any]) -> dict[str, Any]:
    """Runs `python -m module` in one process with `flags` (checking that it succeeds, with the end of its standard
    error as the failure message) and returns the JSON summary it prints."""
    command = [sys.executable, "-m", module, *flag_arguments(flags)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=offline_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def torchrun(module: str, processes: int = 2) -> list[str]:
    """`python -m module` under torchrun with `processes` processes on one machine (gloo on a CPU): the data-parallel
    setup that `accelerate launch` gives on several GPUs."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*launcher, "-m", module]


def launch_env(processes: int = 2) -> dict[str, str]:
    """The environment for a command line under `torchrun(..., processes)`: offline, one thread per process, and no
    GPU where the machine has fewer than `processes` (each rank takes the GPU of its local rank, and on a one-GPU
    machine the second rank's does not exist: "invalid device ordinal"); those run on the CPU with gloo instead."""
    import torch

    env = offline_env()
    if torch.cuda.device_count() < processes:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_launched(module: str, arguments: list[str], processes: int = 2) -> subprocess.CompletedProcess:
    """Runs `module` with `arguments` under `torchrun(module, processes)` in `launch_env(processes)`, checking that
    every process succeeded (with `launch_failure` as the failure message); returns the finished command."""
    command = [*torchrun(module, processes), *arguments]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=launch_env(processes), timeout=600)
    assert done.returncode == 0, launch_failure(done)
    return done


def launch_failure(done: subprocess.CompletedProcess) -> str:
    """Why a launched command failed, for an assertion message: the first traceback a process of the pipeline
    printed (under torchrun the end of standard error is torchrun's own summary, which names only the failed rank and
    its exit code), then the end of standard error: enough of it to hold what a process that died without a Python
    traceback (SIGABRT from native code) printed before torchrun's summary."""
    blocks = re.split(re.escape(TRACEBACK), done.stderr)[1:]
    own = next((block for block in blocks if "torch/distributed/run.py" not in block), None)
    head = f"{TRACEBACK}{own[:4000]}\n...\n" if own is not None else ""
    return head + done.stderr[-6000:]
