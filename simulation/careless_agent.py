"""A careless tool-calling agent: the base policy the feedback benches improve on the tool shop.

The shipped tool policy (`reward_models.policy.tool_bootstrap`) is fine-tuned on the shop oracle's scripted
demonstrations at difficulty 1 (`tool_training_data.demonstrations`) with their deliberate mistakes learned as well as
their repairs: malformed JSON, unknown tools, broken arguments, made-up ids, wrong items and quantities, wasted calls.
The result knows every step of the task, so its greedy episodes still succeed, but at temperature 1 it slips often
enough that it runs out of turns or orders the wrong thing in about half its sampled episodes.

This is the regime feedback works in: the right behaviour is already in the policy's own samples, and labels move
probability towards it. The shipped policy at difficulty 2 is not: there its failures are a skill it lacks (reading the
id whose name matches out of a search result), and a few hundred corrections of that choice, fine-tuned on, left its
held-out success where it was or lowered it. The shipped policy itself learned to copy an id at all from a copy
drill and 6,000 demonstrations over 1,500 steps, not from an annotator's afternoon.

Building it takes a few minutes on two CPU cores; the benches keep it in their working directory.
"""

from __future__ import annotations

from pathlib import Path

from reward_models.envs.base import task_tools
from reward_models.envs.toolshop import ToolShop
from reward_models.policy.tool_bootstrap import SHIPPED_DIR
from reward_models.policy.tool_training_data import demonstrations
from simulation.oracle_data import write_jsonl

# The shop it plays: one item per search result, so every failure is a slip, never a missing skill.
ENVIRONMENT_CONFIG = {"difficulty": 1, "max_turns": 8}
# Training seeds of the demonstrations: far from those the benches' tasks use (500,000 up, per bench seed).
FIRST_SEED = 300_000


def build_careless_agent(
    output_dir: str | Path,
    *,
    mistake_rate: float = 0.4,
    episodes: int = 800,
    steps: int = 300,
    learning_rate: float = 3e-4,
    seed: int = 1,
) -> Path:
    """Fine-tune the shipped tool policy into a careless agent in `output_dir` (a policy directory); returns it.

    `mistake_rate` is the demonstrator's chance of a mistake per turn, each then repaired; every turn is learned.
    """
    from reward_models.finetune.sft import SFTConfig
    from reward_models.finetune.sft import main as sft

    output = Path(output_dir)
    env = ToolShop(**ENVIRONMENT_CONFIG)
    rows = (
        {"messages": demo.messages, "tools": task_tools(demo.task), "source": "demonstration", "step_index": None}
        for demo in demonstrations(env, episodes, mistake_rate, seed=seed, first_seed=FIRST_SEED)
    )
    data = write_jsonl(rows, output.with_name(output.name + "-demonstrations.jsonl"))
    sft(
        SFTConfig(
            policy_path=str(SHIPPED_DIR),
            data_path=str(data),
            output_dir=str(output),
            environment="reward_models.envs.toolshop.ToolShop",
            environment_config=dict(ENVIRONMENT_CONFIG),
            eval_tasks=0,
            learning_rate=learning_rate,
            num_epochs=100.0,  # `steps` decides
            max_steps=steps,
            batch_size=16,
            seed=seed,
        )
    )
    return output
