"""Launching a pipeline's command line as a researcher would, including across several processes."""

from __future__ import annotations

import sys


def torchrun(module: str, processes: int = 2) -> list[str]:
    """`python -m module` under torchrun with `processes` processes on one machine (gloo on a CPU): the data-parallel
    setup that `accelerate launch` gives on several GPUs."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*launcher, "-m", module]
