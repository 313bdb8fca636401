"""Launching a pipeline's command line as a researcher would, including across several processes."""

from __future__ import annotations

import os
import sys


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
