"""What a trainer's own accelerate loop needs: the accelerator, the time limit, sharing work and rollouts across
processes, rollout progress, and loop checkpoints to resume from.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import checkpoint_dir
from reward_models.common.reporting import Reporter
from reward_models.common.runtime import fresh_accelerator, resolve_precision
from reward_models.envs.base import Environment
from reward_models.finetune.config import PolicyTrainConfig

if TYPE_CHECKING:
    from accelerate import Accelerator

    from reward_models.policy.base import Policy
    from reward_models.rollout import Episode


LOOP_STATE_FILE = "loop_state.json"


def out_of_time(config: PolicyTrainConfig, started: float) -> bool:
    """Whether `config.max_seconds` have passed since `started` (a `time.monotonic()` reading). Under several
    processes the first one's clock decides for all: one process stopping alone would leave the others waiting for
    it in their next gradient exchange."""
    if not config.max_seconds:
        return False
    over = time.monotonic() - started > config.max_seconds
    from accelerate import PartialState

    if PartialState().num_processes == 1:
        return over
    from accelerate.utils import broadcast_object_list

    return bool(broadcast_object_list([over], from_process=0)[0])


def process_share(accelerator: Accelerator, batch: list[int]) -> list[int]:
    """This process's share of `batch` under several processes (the gradients are averaged across them); all of it
    with one process, or when the batch is smaller than the number of processes."""
    return batch[accelerator.process_index :: accelerator.num_processes] or batch


def shared_rollout(
    accelerator: Accelerator,
    env_factory: Callable[[], Environment],
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    *,
    seed: int,
    **options: Any,
) -> list[Episode]:
    """`rollout.rollout` split across the processes: each rolls out its share of the tasks (every sample of a task
    in one process), with its own sampling seeds, and every process gets all the episodes, in the order of the
    processes, so the update that follows is the same everywhere. With one process, exactly `rollout`."""
    from reward_models.rollout import rollout

    if accelerator.num_processes == 1:
        return rollout(env_factory, tasks, policy, seed=seed, **options)
    from accelerate.utils import gather_object

    rank = accelerator.process_index
    mine = list(tasks[rank :: accelerator.num_processes])
    return gather_object(rollout(env_factory, mine, policy, seed=seed + rank * 2**31, **options))


def rollout_progress(reporter: Reporter, iteration: int, iterations: int) -> Callable[[int, int], None]:
    """The progress callback of an online trainer's rollouts in iteration `iteration` (from 1). After every turn it
    reports training's progress as it stands (the iterations finished before this one), so the bar keeps counting
    iterations while the reporter still sees a call each turn: a cancel stops the rollouts within a turn."""
    return lambda done, total: reporter.progress(iteration - 1, iterations)


def make_accelerator(config: PolicyTrainConfig) -> Accelerator:
    """An `Accelerator` with the config's precision (fp32 on CPU) on the one device, or on every process of an
    `accelerate launch`."""
    return fresh_accelerator(resolve_precision(config.precision))


def loop_checkpoints(config: PolicyTrainConfig) -> list[Path]:
    """The run's complete loop checkpoints (`checkpoints/step-N`), oldest first."""
    folder = checkpoint_dir(config.output_dir)
    if not folder.is_dir():
        return []
    complete = [path for path in folder.glob("step-*") if (path / LOOP_STATE_FILE).is_file()]
    return sorted(complete, key=lambda path: int(path.name.removeprefix("step-")))


def save_loop_checkpoint(
    accelerator: Accelerator, config: PolicyTrainConfig, step: int, state: dict[str, Any]
) -> Path:
    """Save everything `accelerator` prepared (models, optimisers, schedulers, RNG states) and `state` (JSON: the
    loop's own counters and history) as `checkpoints/step-<step>`, written aside and renamed into place so a crash
    mid-save leaves the previous checkpoint intact; the last two are kept."""
    folder = checkpoint_dir(config.output_dir) / f"step-{step}"
    staging = folder.with_name(folder.name + ".part")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    # Every process writes its own RNG state into `staging`, and `save_state` ends without a barrier: renaming before
    # the others finish makes their writes fail ("parent directory ... does not exist").
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / LOOP_STATE_FILE).write_text(json.dumps({"step": step, **state}, default=float) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        for old in loop_checkpoints(config)[:-2]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return folder


def resume_loop_checkpoint(
    accelerator: Accelerator, config: PolicyTrainConfig
) -> tuple[int, dict[str, Any], Path | None]:
    """Load the newest loop checkpoint into what `accelerator` prepared (call after `prepare`): returns its step,
    its `state` and its path, or `(0, {}, None)` when the run has none."""
    checkpoints = loop_checkpoints(config)
    if not checkpoints:
        return 0, {}, None
    latest = checkpoints[-1]
    accelerator.load_state(str(latest))
    state = json.loads((latest / LOOP_STATE_FILE).read_text())
    return int(state.pop("step")), state, latest
