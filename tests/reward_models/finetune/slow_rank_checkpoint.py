"""Run under torchrun by test_common: `save_loop_checkpoint` across two processes where the second writes its part
of the checkpoint (its RNG state) a second later than the first. Exits non-zero when a checkpoint comes out
incomplete or a process fails to write into it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import accelerate.accelerator
import torch

from reward_models.common.runtime import fresh_accelerator
from reward_models.finetune.config import PolicyTrainConfig
from reward_models.finetune.loops import LOOP_STATE_FILE, save_loop_checkpoint

save_state_files = accelerate.accelerator.save_accelerator_state


def slow_second_rank(*args, **kwargs):
    if torch.distributed.get_rank() == 1:
        time.sleep(1.0)
    return save_state_files(*args, **kwargs)


def main(output_dir: str) -> None:
    accelerate.accelerator.save_accelerator_state = slow_second_rank
    accelerator = fresh_accelerator("fp32")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    config = PolicyTrainConfig(policy_path="unused", output_dir=output_dir, eval_tasks=0)
    for step in (1, 2):
        folder = save_loop_checkpoint(accelerator, config, step, {"history": [step]})
    written = sorted(path.name for path in Path(folder).iterdir())
    missing = {"random_states_0.pkl", "random_states_1.pkl", LOOP_STATE_FILE} - set(written)
    if missing:
        sys.exit(f"rank {accelerator.process_index}: {folder} lacks {sorted(missing)}; it holds {written}")


if __name__ == "__main__":
    main(sys.argv[1])
