"""Launching a pipeline's command line as a researcher would, including across several processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

TRACEBACK = "Traceback (most recent call last):"


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

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    if torch.cuda.device_count() < processes:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def launch_failure(done: subprocess.CompletedProcess) -> str:
    """Why a launched command failed, for an assertion message: the first traceback a process of the pipeline
    printed (under torchrun the end of standard error is torchrun's own summary, which names only the failed rank and
    its exit code), then the end of standard error: enough of it to hold what a process that died without a Python
    traceback (SIGABRT from native code) printed before torchrun's summary."""
    blocks = re.split(re.escape(TRACEBACK), done.stderr)[1:]
    own = next((block for block in blocks if "torch/distributed/run.py" not in block), None)
    head = f"{TRACEBACK}{own[:4000]}\n...\n" if own is not None else ""
    return head + done.stderr[-6000:]
