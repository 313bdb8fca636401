"""Bootstrap the built-in tiny tool-calling policy for the shop by supervised fine-tuning on scripted demonstrations.

The demonstrator is the shop's oracle (``reward_models.envs.toolshop``), writing Qwen2.5-format assistant turns
(``<tool_call>`` JSON blocks). With probability ``noise`` a turn is a mistake instead (a wrong item or quantity, a
made-up id, broken JSON, an unknown tool, arguments that break the schema, a wasted call), which the environment
answers as it would answer the policy, and from which the oracle then recovers. The loss covers the assistant tokens
of the correct turns only: the policy sees mistakes and their error messages in context and learns to recover from
them, without learning to make them. Conversations are built with the same functions as a rollout
(``prompt_messages``, ``reply_messages``, the task's tools in the chat template), so the policy is trained on exactly
the text it later reads.

The model is a small Qwen2 with tied embeddings, and a byte-level BPE tokenizer trained on the shop's text in which
every item id is one token.

Copying is the hard part. Every slot that matters in a shop conversation is copied from the context: the item name from
the instruction into the search query, the id from the search result, the quantity from the instruction. Trained on
demonstrations alone, a model this small settles within a minute on constant guesses for all of them and stays there
for thousands of steps, because a few copied tokens among hundreds give attention too weak a signal. So training opens
with ``copy_drill_steps`` steps of a synthetic copy drill (``tool_training_data.copy_drill_rows``: random token
sequences shown twice, and search results whose items are shown again one by one), which builds the copying (induction)
circuit before any demonstration.

The demonstrations are at ``train_difficulty`` 1, where a search returns only the item to buy: the policy learns the
format, to search for the name it was given, to copy the id the search returns and the quantity it was asked for,
and to check out. It is evaluated at ``difficulty`` 2, the shop's default, where a search returns the item among
others that share a word with it: the policy adds one of the ids it was shown, not always the one whose name
matches, and so succeeds on a part of the tasks. Telling the right id from the others by its name is what feedback
has to teach it.

Deterministic for a given config and ``num_threads``, as long as ``max_seconds`` does not cut training short.

Training the defaults takes about 20 minutes on one CPU core, so the weights they give are shipped in
``SHIPPED_DIR`` (about 4 MB, made by this command with ``--use_shipped false`` and the default config), with their
``metrics.json``. With ``use_shipped`` (the default) and a config whose training fields equal theirs, the command
copies them instead of training, and evaluates the copy on this machine. ``bench/tool_policy.py`` trains them again
and compares.

    python -m reward_models.policy.tool_bootstrap --output_dir var/policies/toolshop --seed 0
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from reward_models.envs.base import task_tools
from reward_models.envs.toolshop import ToolShop
from reward_models.envs.toolshop_catalogue import DIFFICULTIES, ITEM_IDS, vocabulary_corpus
from reward_models.policy.bootstrap import (
    check_training_settings,
    config_parser,
    model_settings,
    torch_threads,
    train_steps,
    write_metrics,
)
from reward_models.policy.tool_training_data import (
    copy_drill_rows,
    demonstrations,
    encode_demonstrations,
    training_row,
)

SHIPPED_DIR = Path(__file__).resolve().parent / "weights" / "toolshop"
# Settings that change where the policy goes or how it is evaluated, not what is trained.
RUNTIME_FIELDS = frozenset(
    {"output_dir", "use_shipped", "num_threads", "max_seconds", "eval_tasks", "eval_temperature", "eval_batch_size"}
    | {"difficulty"}
    | {"curve_every", "curve_tasks"}
)


@dataclass
class ToolBootstrapConfig:
    output_dir: str = field(default="var/policies/toolshop", metadata={"help": "Where the policy directory goes."})
    use_shipped: bool = field(
        default=True,
        metadata={"help": "Copy the shipped weights instead of training, when the training settings equal theirs."},
    )
    seed: int = field(default=0, metadata={"help": "Seeds demonstration noise, initial weights and batch order."})

    # Environment
    train_difficulty: int = field(default=1, metadata={"help": "ToolShop difficulty (1-4) of the demonstrations."})
    difficulty: int = field(
        default=2, metadata={"help": "ToolShop difficulty (1-4) the policy is evaluated at, the project's."}
    )
    max_turns: int = field(default=8, metadata={"help": "ToolShop assistant-turn limit per episode."})

    # Demonstrations
    n_episodes: int = field(default=6_000, metadata={"help": "Scripted demonstration episodes."})
    noise: float = field(default=0.1, metadata={"help": "Probability that a demonstrated turn is a mistake."})

    # Copy drill
    copy_drill_steps: int = field(
        default=300, metadata={"help": "Optimiser steps on the synthetic copy drill before any demonstration."}
    )
    copy_drill_every: int = field(
        default=0, metadata={"help": "After those, every n-th step is a copy-drill step (0: none)."}
    )
    copy_drill_length: int = field(default=24, metadata={"help": "Tokens in one random copy-drill sequence."})
    copy_drill_batch_size: int = field(default=32, metadata={"help": "Copy-drill sequences per drill step."})

    # Model
    vocab_size: int = field(default=4096, metadata={"help": "Cap on the BPE vocabulary (the corpus saturates it)."})
    hidden_size: int = field(default=128, metadata={"help": "Qwen2 hidden size."})
    num_layers: int = field(default=3, metadata={"help": "Qwen2 decoder layers."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads."})
    intermediate_size: int = field(default=384, metadata={"help": "MLP width."})

    # Optimisation
    lr: float = field(default=3e-3, metadata={"help": "Peak AdamW learning rate."})
    batch_size: int = field(default=16, metadata={"help": "Episodes per optimiser step."})
    max_train_steps: int = field(default=1500, metadata={"help": "Optimiser steps (the cosine schedule's length)."})
    warmup_steps: int = field(default=100, metadata={"help": "Linear warm-up steps."})
    max_seconds: float = field(
        default=3600.0,
        metadata={
            "help": "Wall-clock budget from the start of the run to the end of training (evaluation comes after), a "
            "guard against a stalled machine; training cut short by it is no longer deterministic."
        },
    )
    num_threads: int = field(default=2, metadata={"help": "torch CPU threads (results depend on it)."})

    # Evaluation
    eval_tasks: int = field(default=200, metadata={"help": "How many of the held-out evaluation seeds to use."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Temperature of the sampled evaluation."})
    eval_batch_size: int = field(default=100, metadata={"help": "Conversations generated together."})
    max_new_tokens: int = field(default=64, metadata={"help": "Most tokens one assistant turn may generate."})
    curve_every: int = field(
        default=0,
        metadata={"help": "Evaluate greedy success every n steps during training, for the curve (0: never)."},
    )
    curve_tasks: int = field(default=50, metadata={"help": "Held-out tasks of each point of that curve."})

    def __post_init__(self) -> None:
        positive = ("max_turns", "n_episodes", "vocab_size", "hidden_size", "num_layers", "num_heads")
        positive += ("intermediate_size", "batch_size", "max_train_steps", "num_threads", "eval_tasks")
        positive += ("eval_batch_size", "max_new_tokens", "copy_drill_batch_size", "curve_tasks")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("train_difficulty", "difficulty"):
            if getattr(self, name) not in DIFFICULTIES:
                raise ValueError(f"{name} must be one of {sorted(DIFFICULTIES)}, got {getattr(self, name)}")
        for name in ("copy_drill_steps", "copy_drill_every", "curve_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.copy_drill_steps >= self.max_train_steps:
            raise ValueError(f"copy_drill_steps ({self.copy_drill_steps}) must be below max_train_steps")
        if self.copy_drill_length < 2:
            raise ValueError(f"copy_drill_length must be at least 2, got {self.copy_drill_length}")
        if not 0.0 <= self.noise <= 0.5:
            raise ValueError(f"noise must be between 0 and 0.5, got {self.noise}")
        check_training_settings(self)

    def training_fields(self) -> dict[str, Any]:
        """The settings that decide the weights."""
        return {key: value for key, value in asdict(self).items() if key not in RUNTIME_FIELDS}

    def env_config(self) -> dict[str, Any]:
        """The shop the policy is evaluated in (and a project's environment config)."""
        return {"difficulty": self.difficulty, "max_turns": self.max_turns}

    def is_drill_step(self, step: int) -> bool:
        """Whether optimiser step ``step`` (from 0) trains on the copy drill rather than on demonstrations."""
        if step < self.copy_drill_steps:
            return True
        return bool(self.copy_drill_every) and (step - self.copy_drill_steps) % self.copy_drill_every == 0


def build_tool_policy_model(tokenizer: Any, config: ToolBootstrapConfig) -> Any:
    """A freshly initialised Qwen2 with tied embeddings, sized by ``config``."""
    from reward_models.policy.model import build_tiny_qwen2

    return build_tiny_qwen2(tokenizer, **model_settings(config))


def shipped_metrics() -> dict[str, Any] | None:
    """The shipped policy's ``metrics.json`` (its training config and the figures measured when it was made)."""
    path = SHIPPED_DIR / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


def shipped_config() -> ToolBootstrapConfig | None:
    """The config the shipped policy was made with."""
    shipped = shipped_metrics()
    if shipped is None:
        return None
    known = {config_field.name for config_field in fields(ToolBootstrapConfig)}
    return ToolBootstrapConfig(**{key: value for key, value in shipped["config"].items() if key in known})


def uses_shipped(config: ToolBootstrapConfig) -> bool:
    """Whether ``main`` copies the shipped weights for ``config`` instead of training."""
    made_with = shipped_config()
    return config.use_shipped and made_with is not None and made_with.training_fields() == config.training_fields()


def main(config: ToolBootstrapConfig, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Generate demonstrations, train the tiny Qwen2, save it to ``output_dir``, evaluate, write metrics.json; or,
    when ``uses_shipped(config)``, copy the shipped policy there and evaluate it."""
    with torch_threads(config.num_threads):
        return _copy_shipped(config, progress) if uses_shipped(config) else _train(config, progress)


def _train(config: ToolBootstrapConfig, progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from reward_models.policy.chat_format import build_bpe_tokenizer, render_chat
    from reward_models.policy.model import save_policy

    started = time.monotonic()
    env = ToolShop(**config.env_config())
    demo_env = ToolShop(difficulty=config.train_difficulty, max_turns=config.max_turns)
    demos = demonstrations(demo_env, config.n_episodes, config.noise, config.seed)
    corpus = [render_chat(d.messages, task_tools(d.task)) for d in demos[:2000]]
    tokenizer = build_bpe_tokenizer(corpus + vocabulary_corpus(), config.vocab_size, added_tokens=ITEM_IDS)
    demo_rows = [training_row(*row) for row in encode_demonstrations(tokenizer, demos)]
    drill_steps = sum(config.is_drill_step(step) for step in range(config.max_train_steps))
    drill_count = drill_steps * config.copy_drill_batch_size
    drill_rows = copy_drill_rows(tokenizer, drill_count, config.copy_drill_length, config.seed)
    demo_seconds = time.monotonic() - started

    model = build_tool_policy_model(tokenizer, config)
    order = random.Random(config.seed)
    demo_batches = _batches([len(ids) for ids, _ in demo_rows], config.batch_size, order)
    drill_batches = _batches([len(ids) for ids, _ in drill_rows], config.copy_drill_batch_size, order)
    eval_seeds = list(env.eval_seeds())
    evaluate = partial(_evaluate, model, tokenizer, config)
    curve: list[dict[str, float]] = []

    def step_loss(step: int) -> Any:
        drill = config.is_drill_step(step)
        rows = drill_rows if drill else demo_rows
        batch = next(drill_batches if drill else demo_batches)
        input_ids, labels, attention_mask = _collate([rows[i] for i in batch], tokenizer.pad_token_id)
        return assistant_loss(model, input_ids, labels, attention_mask)

    def curve_point(step: int) -> None:
        if config.curve_every and (step + 1) % config.curve_every == 0 and step + 1 < config.max_train_steps:
            point = evaluate(eval_seeds[: config.curve_tasks], greedy=True)
            curve.append({"step": step + 1, "greedy_success": point["success_rate"], "stderr": point["stderr"]})
            tqdm.write(json.dumps(curve[-1]))
            model.train()

    run = train_steps(
        model,
        config,
        started,
        step_loss,
        desc="toolshop SFT",
        progress=progress,
        betas=(0.9, 0.98),
        postfix=lambda step: {"kind": "drill" if config.is_drill_step(step) else "demo"},
        after_step=curve_point,
    )
    losses = run.losses
    demo_losses = [loss for step, loss in enumerate(losses) if not config.is_drill_step(step)]

    model.eval()
    output_dir = save_policy(
        model, tokenizer, config.output_dir, history_window=None, max_new_tokens=config.max_new_tokens
    )
    eval_started = time.monotonic()
    greedy = evaluate(eval_seeds[: config.eval_tasks], greedy=True)
    sampled = evaluate(eval_seeds[: config.eval_tasks], greedy=False)
    # Demonstration loss only: drill steps have a loss of their own, near zero once copying is learned.
    tail = demo_losses[-50:] or losses[-50:]
    metrics = {
        "final_loss": sum(tail) / len(tail),
        "initial_loss": losses[0],
        "demo_loss_curve": [round(x, 4) for x in demo_losses[:: max(1, len(demo_losses) // 50)]],
        **_success_metrics(greedy, sampled),
        "shipped": False,
        "success_curve": curve,
        "demo_success": sum(d.success for d in demos) / len(demos),
        "eval_tasks": config.eval_tasks,
        "train_episodes": len(demo_rows),
        "train_steps": len(losses),
        "drill_steps": sum(config.is_drill_step(step) for step in range(len(losses))),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "stopped_by_time": run.stopped_by_time,
        "demo_seconds": demo_seconds,
        "train_seconds": run.seconds,
        "eval_seconds": time.monotonic() - eval_started,
    }
    return write_metrics(output_dir, config, started, metrics)


def _copy_shipped(config: ToolBootstrapConfig, progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for path in SHIPPED_DIR.iterdir():
        if path.is_file() and path.name != "metrics.json":
            shutil.copyfile(path, output_dir / path.name)
    shipped = shipped_metrics()
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    if progress is not None:
        progress(1, 1)
    eval_started = time.monotonic()
    seeds = list(ToolShop(**config.env_config()).eval_seeds())[: config.eval_tasks]
    greedy = _evaluate(model, tokenizer, config, seeds, greedy=True)
    sampled = _evaluate(model, tokenizer, config, seeds, greedy=False)
    metrics = {
        **shipped,
        **_success_metrics(greedy, sampled),
        "shipped": True,
        "shipped_greedy_success": shipped["greedy_success"],
        "shipped_sampled_success": shipped["sampled_success"],
        "eval_tasks": config.eval_tasks,
        "train_seconds": 0.0,
        "eval_seconds": time.monotonic() - eval_started,
    }
    return write_metrics(output_dir, config, started, metrics)


def _success_metrics(greedy: dict[str, Any], sampled: dict[str, Any]) -> dict[str, Any]:
    return {
        f"{decoding}_{name}": result[key]
        for decoding, result in (("greedy", greedy), ("sampled", sampled))
        for name, key in (("success", "success_rate"), ("stderr", "stderr"), ("mean_turns", "mean_length"))
    }


def _evaluate(model: Any, tokenizer: Any, config: ToolBootstrapConfig, seeds: list[int], greedy: bool) -> dict:
    """Success of ``model`` on the held-out ``seeds``, rolled out as a served policy is (`reward_models.rollout`)."""
    from reward_models.policy.local import LocalCausalLMPolicy
    from reward_models.rollout import evaluate_success

    model.eval()
    policy = LocalCausalLMPolicy.from_model(
        model, tokenizer, history_window=None, max_new_tokens=config.max_new_tokens, batch_size=config.eval_batch_size
    )
    env_factory = partial(ToolShop, **config.env_config())
    return evaluate_success(
        policy, env_factory, seeds, greedy=greedy, temperature=config.eval_temperature, seed=config.seed
    )


def assistant_loss(model: Any, input_ids: Any, labels: Any, attention_mask: Any) -> Any:
    """Mean next-token cross-entropy over the labelled (assistant) tokens. The output layer runs only on the
    positions that predict one, about a quarter of a shop conversation."""
    import torch

    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def _batches(lengths: list[int], batch_size: int, order: random.Random) -> Iterator[list[int]]:
    """Endless batches of row indices, reshuffled each epoch. Rows of similar length share a batch (sorted within
    groups of 16 batches, then the batches shuffled), which cuts padding to a few percent."""
    group = 16 * batch_size
    while True:
        indices = list(range(len(lengths)))
        order.shuffle(indices)
        batches = []
        for start in range(0, len(indices) - group + 1, group):
            chunk = sorted(indices[start : start + group], key=lengths.__getitem__)
            batches += [chunk[i : i + batch_size] for i in range(0, group, batch_size)]
        if not batches:  # fewer rows than one group
            batches = [indices[i : i + batch_size] for i in range(0, len(indices) - batch_size + 1, batch_size)]
        order.shuffle(batches)
        yield from batches


def _collate(rows: list[tuple[list[int], list[int]]], pad_token_id: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, targets) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(targets)
        attention_mask[row, : len(ids)] = 1
    return input_ids, labels, attention_mask


def parse_args(argv: list[str] | None = None) -> ToolBootstrapConfig:
    parser = config_parser(ToolBootstrapConfig, __doc__.split("\n\n")[0])
    return ToolBootstrapConfig(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    result = main(parse_args())
    summary = {key: value for key, value in result.items() if key not in ("demo_loss_curve", "config")}
    print(json.dumps(summary, indent=2))
