"""Bootstrap the built-in tiny gridworld policy by supervised fine-tuning on noisy scripted demonstrations.

The demonstrator knows the map: its reasoning states the true offset to the goal (``goal is down 2 right 3``) and its
action is a shortest-path move, except that with probability ``noise`` the action is uniformly random. The policy
learns the demonstrator's reasoning well and its actions imperfectly, which leaves a clearly imperfect policy for
human feedback to improve. Greedy decoding of a Markov policy loops once it repeats a wasted move, so greedy success
sits below sampled success.

Measured with the defaults (7x7 grid, 15-step limit, 10k demonstrations, 350 steps of batch 128) on 2 CPU cores, on
the 200 held-out seeds: seed 0, 47 % greedy and 52 % sampled success; seed 1, 33 % and 46.5 %; about 125 s in all,
evaluation included.

Deterministic for a given config: the same seed gives the same demonstrations, initial weights, batch order and so
the same weights and success figures, as long as training is not cut short by ``max_seconds`` (metrics record
``stopped_by_time``) and ``num_threads`` is the same.

    python -m reward_models.policy.bootstrap --output_dir var/policies/bootstrap --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from reward_models.conversation import StepTurn, build_conversation
from reward_models.envs.base import prompt_messages, reply_messages, training_seeds
from reward_models.envs.gridworld import ACTIONS, AGENT, GOAL, INSTRUCTION, GridWorld, parse_observation
from reward_models.policy.turns import encode_turns, turn_views


@dataclass
class BootstrapConfig:
    output_dir: str = field(default="var/policies/bootstrap", metadata={"help": "Where the policy directory goes."})
    seed: int = field(default=0, metadata={"help": "Seeds demonstrations noise, initial weights and batch order."})

    # Environment
    grid_size: int = field(default=7, metadata={"help": "Gridworld side length."})
    wall_prob: float = field(default=0.2, metadata={"help": "Probability that a cell is a wall."})
    max_episode_steps: int = field(default=15, metadata={"help": "Gridworld step limit per episode."})

    # Demonstrations
    n_episodes: int = field(default=10_000, metadata={"help": "Scripted demonstration episodes."})
    noise: float = field(default=0.35, metadata={"help": "Probability that a demonstrated action is random."})

    # Model
    hidden_size: int = field(default=128, metadata={"help": "Llama hidden size."})
    num_layers: int = field(default=3, metadata={"help": "Llama decoder layers."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads."})
    intermediate_size: int = field(default=256, metadata={"help": "MLP width."})
    history_window: int = field(
        default=0, metadata={"help": "Previous turns the policy sees (0: the current map only, which is Markov)."}
    )

    # Optimisation
    lr: float = field(default=2e-3, metadata={"help": "Peak AdamW learning rate."})
    batch_size: int = field(default=128, metadata={"help": "Turns per optimiser step."})
    max_train_steps: int = field(default=350, metadata={"help": "Optimiser steps (the cosine schedule's length)."})
    warmup_steps: int = field(default=50, metadata={"help": "Linear warm-up steps."})
    max_seconds: float = field(
        default=1200.0,
        metadata={
            "help": "Wall-clock budget from the start of the run to the end of training (evaluation comes after), a "
            "guard against a stalled machine; training cut short by it is no longer deterministic, and a policy cut "
            "before its schedule ends is much worse."
        },
    )
    num_threads: int = field(default=2, metadata={"help": "torch CPU threads (results depend on it)."})

    # Evaluation
    eval_tasks: int = field(default=200, metadata={"help": "How many of the held-out evaluation seeds to use."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Temperature of the sampled evaluation."})

    def __post_init__(self) -> None:
        positive = ("grid_size", "max_episode_steps", "n_episodes", "hidden_size", "num_layers", "num_heads")
        positive += ("intermediate_size", "batch_size", "max_train_steps", "num_threads", "eval_tasks")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 3 <= self.grid_size <= 10:
            raise ValueError(f"grid_size must be between 3 and 10, got {self.grid_size}")
        if not 0.0 <= self.wall_prob <= 0.6:
            raise ValueError(f"wall_prob must be between 0 and 0.6, got {self.wall_prob}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be between 0 and 1, got {self.noise}")
        if self.history_window < 0:
            raise ValueError(f"history_window must be >= 0, got {self.history_window}")
        check_training_settings(self)

    def env_config(self) -> dict[str, Any]:
        return {"size": self.grid_size, "wall_prob": self.wall_prob, "max_steps": self.max_episode_steps}


def goal_reasoning(observation: str) -> str:
    """The demonstrator's reasoning: where the goal lies from the agent, e.g. ``goal is down 2 right 3``."""
    rows = parse_observation(observation)
    cells = {cell: (r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if cell in (AGENT, GOAL)}
    (agent_row, agent_col), (goal_row, goal_col) = cells[AGENT], cells[GOAL]
    vertical = f"down {goal_row - agent_row}" if goal_row >= agent_row else f"up {agent_row - goal_row}"
    horizontal = f"right {goal_col - agent_col}" if goal_col >= agent_col else f"left {agent_col - goal_col}"
    return f"goal is {vertical} {horizontal}"


def vocabulary_corpus(env: GridWorld) -> list[str]:
    """Every word the gridworld policy reads or writes, so the vocabulary does not depend on the demonstrations."""
    digits = " ".join(str(d) for d in range(env.size))
    return [INSTRUCTION, "# . A G |", f"goal is {' '.join(ACTIONS)} {digits} ; action"]


def demonstrations(env: GridWorld, n_episodes: int, noise: float, seed: int) -> tuple[list[dict], float]:
    """Scripted episodes as ``{"task", "conversation"}`` dicts (`reward_models.conversation`), and the share of them
    that reached the goal."""
    rng = random.Random(seed)
    episodes = []
    successes = 0
    for task_seed in training_seeds(env, n_episodes):
        task = env.make_task(task_seed)
        oracle = env.oracle(task)
        observation = env.reset(task)
        prompt = prompt_messages(env, task, observation)
        actions: list[str] = []
        steps = []
        done = False
        while not done:
            action = rng.choice(ACTIONS) if rng.random() < noise else rng.choice(oracle.best_actions(actions))
            message = env.message_for_action(action, goal_reasoning(observation))
            result = env.step(action)
            steps.append(StepTurn(message, reply_messages(result)))
            actions.append(action)
            observation, done = result.observation, result.done
            successes += result.info["success"]
        episodes.append({"task": task, "conversation": build_conversation(prompt, steps)})
    return episodes, successes / n_episodes


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block on `count` torch CPU threads (a bootstrap's results depend on it), then give the caller back
    its own number: a test process or a web process that trains a demo policy keeps the threads it chose."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def main(config: BootstrapConfig, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Generate demonstrations, fine-tune the tiny Llama, save it to ``output_dir``, evaluate, write metrics.json."""
    with torch_threads(config.num_threads):
        return _train(config, progress)


def _train(config: BootstrapConfig, progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    from reward_models.policy.local import LocalCausalLMPolicy
    from reward_models.policy.model import build_tiny_llama, save_policy
    from reward_models.policy.tokenizer import build_word_tokenizer
    from reward_models.rollout import evaluate_success

    started = time.monotonic()
    env = GridWorld(**config.env_config())
    tokenizer = build_word_tokenizer(vocabulary_corpus(env))

    episodes, demo_success = demonstrations(env, config.n_episodes, config.noise, config.seed)
    input_ids, labels = _encode_demonstrations(tokenizer, episodes, config.history_window)

    model = build_tiny_llama(tokenizer, **model_settings(config))
    batches = _shuffled_batches(len(input_ids), config.batch_size, config.seed)

    def step_loss(step: int) -> Any:
        batch = next(batches)
        batch_ids = input_ids[batch]
        return model(
            input_ids=batch_ids, attention_mask=batch_ids != tokenizer.pad_token_id, labels=labels[batch]
        ).loss

    run = train_steps(model, config, started, step_loss, desc="bootstrap SFT", progress=progress)
    losses = run.losses

    output_dir = save_policy(
        model, tokenizer, config.output_dir, history_window=config.history_window, max_new_tokens=16
    )
    policy = LocalCausalLMPolicy.from_model(model, tokenizer, history_window=config.history_window, max_new_tokens=16)
    eval_seeds = list(env.eval_seeds())[: config.eval_tasks]
    env_factory = partial(GridWorld, **config.env_config())
    greedy = evaluate_success(policy, env_factory, eval_seeds, greedy=True, seed=config.seed)
    sampled = evaluate_success(
        policy, env_factory, eval_seeds, greedy=False, temperature=config.eval_temperature, seed=config.seed
    )
    # The first ~50 steps are mostly warm-up noise; report the tail average as the converged loss.
    tail = losses[-50:]
    metrics = {
        "final_loss": sum(tail) / len(tail),
        "initial_loss": losses[0],
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]],
        "greedy_success": greedy["success_rate"],
        "greedy_stderr": greedy["stderr"],
        "greedy_mean_length": greedy["mean_length"],
        "sampled_success": sampled["success_rate"],
        "sampled_stderr": sampled["stderr"],
        "sampled_mean_length": sampled["mean_length"],
        "demo_success": demo_success,
        "eval_tasks": len(eval_seeds),
        "train_examples": len(input_ids),
        "train_steps": len(losses),
        "parameters": sum(p.numel() for p in model.parameters()),
        "stopped_by_time": run.stopped_by_time,
        "train_seconds": run.seconds,
    }
    return write_metrics(output_dir, config, started, metrics)


def _shuffled_batches(count: int, batch_size: int, seed: int) -> Iterator[Any]:
    """Endless batches of `batch_size` row indices out of `count`: seeded permutations of the rows, each read in
    order until fewer rows than a batch are left, then the next."""
    import torch

    order = torch.Generator().manual_seed(seed)
    permutation, cursor = torch.randperm(count, generator=order), 0
    while True:
        if cursor + batch_size > len(permutation):
            permutation, cursor = torch.randperm(count, generator=order), 0
        yield permutation[cursor : cursor + batch_size]
        cursor += batch_size


@dataclass
class TrainedSteps:
    """What `train_steps` did: the loss of every optimiser step it took, whether `max_seconds` cut the schedule
    short, and how many seconds training took."""

    losses: list[float]
    stopped_by_time: bool
    seconds: float


def train_steps(
    model: Any,
    config: Any,
    started: float,
    step_loss: Callable[[int], Any],
    *,
    desc: str,
    progress: Callable[[int, int], None] | None,
    betas: tuple[float, float] = (0.9, 0.999),
    postfix: Callable[[int], dict[str, str]] = lambda step: {},
    after_step: Callable[[int], None] = lambda step: None,
) -> TrainedSteps:
    """How a bootstrap trains its model: `config.max_train_steps` AdamW steps (peak learning rate `config.lr`,
    weight decay 0.01, `betas`) on the `warmup_cosine` schedule, each on the loss `step_loss(step)` gives, with the
    gradients clipped to norm 1, stopping early once `config.max_seconds` have passed since `started`. A progress
    bar named `desc` shows each step's loss and `postfix(step)`; after each step `after_step(step)` runs, then
    `progress(done, total)`."""
    import torch
    from tqdm.auto import tqdm

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01, betas=betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(config.warmup_steps, config.max_train_steps)
    )
    model.train()
    losses: list[float] = []
    stopped_by_time = False
    train_started = time.monotonic()
    bar = tqdm(total=config.max_train_steps, desc=desc, unit="step")
    for step in range(config.max_train_steps):
        if time.monotonic() - started > config.max_seconds:
            stopped_by_time = True
            break
        loss = step_loss(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}", **postfix(step))
        after_step(step)
        if progress is not None:
            progress(step + 1, config.max_train_steps)
    bar.close()
    return TrainedSteps(losses, stopped_by_time, time.monotonic() - train_started)


def write_metrics(output_dir: Path, config: Any, started: float, metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` with the run's ``wall_seconds`` (since `started`) and its ``config`` last, written to the policy
    directory's ``metrics.json``."""
    metrics = {**metrics, "wall_seconds": time.monotonic() - started, "config": asdict(config)}
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _encode_demonstrations(tokenizer: Any, episodes: list[dict], history_window: int) -> tuple[Any, Any]:
    """One training row per demonstrated turn: the prompt the policy sees before it (`turns.turn_views`), then the
    turn, loss on the turn only."""
    import torch

    conversations, completions = [], []
    for episode in episodes:
        views, messages = turn_views(episode["conversation"], history_window)
        conversations += views
        completions += messages
    encodings = encode_turns(tokenizer, conversations, completions)
    width = max(len(e.prompt_ids) + len(e.completion_ids) for e in encodings)
    rows, targets = [], []
    for encoding in encodings:
        padding = width - len(encoding.prompt_ids) - len(encoding.completion_ids)
        rows.append(encoding.prompt_ids + encoding.completion_ids + [tokenizer.pad_token_id] * padding)
        targets.append([-100] * len(encoding.prompt_ids) + encoding.completion_ids + [-100] * padding)
    return torch.tensor(rows), torch.tensor(targets)


def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def check_training_settings(config: Any) -> None:
    """The checks a bootstrap config's model and optimiser settings share; a ValueError names the setting."""
    if config.hidden_size % config.num_heads:
        raise ValueError(f"hidden_size ({config.hidden_size}) must be divisible by num_heads ({config.num_heads})")
    if config.lr <= 0:
        raise ValueError(f"lr must be positive, got {config.lr}")
    if config.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {config.warmup_steps}")
    if config.max_seconds <= 0:
        raise ValueError(f"max_seconds must be positive, got {config.max_seconds}")
    if config.eval_temperature <= 0:
        raise ValueError(f"eval_temperature must be positive, got {config.eval_temperature}")


def model_settings(config: Any) -> dict[str, Any]:
    """A bootstrap config's model size and seed, as `policy.model`'s tiny-model builders take them."""
    return {
        "hidden_size": config.hidden_size,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "seed": config.seed,
    }


def config_parser(config_class: type, description: str) -> argparse.ArgumentParser:
    """A command line with one ``--<field>`` per field of the dataclass ``config_class``, its help and default."""
    parser = argparse.ArgumentParser(description=description)
    for config_field in fields(config_class):
        kind = type(config_field.default)
        parser.add_argument(
            f"--{config_field.name}",
            type=(lambda text: text.lower() in ("1", "true", "yes")) if kind is bool else kind,
            default=config_field.default,
            help=f"{config_field.metadata['help']} (default: {config_field.default})".replace("%", "%%"),
        )
    return parser


def parse_args(argv: list[str] | None = None) -> BootstrapConfig:
    parser = config_parser(BootstrapConfig, __doc__.split("\n\n")[0])
    return BootstrapConfig(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    result = main(parse_args())
    summary = {key: value for key, value in result.items() if key not in ("loss_curve", "config")}
    print(json.dumps(summary, indent=2))
