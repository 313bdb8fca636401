"""Reward model: Bradley-Terry on whole-trajectory comparisons, through TRL's `RewardTrainer`.

Any causal-LM or encoder directory gets a one-output sequence-classification head
(``AutoModelForSequenceClassification``, ``num_labels=1``) and learns r(prompt, completion) so that
P(chosen > rejected) = sigmoid(r_chosen - r_rejected). It trains on Tandem's `preference` export: conversational rows
(message lists, rendered with the tokenizer's chat template and the row's ``tools``, or as the ``Role: content``
transcript when it has none) or `text` rows (prompt + completion strings). The model reads what it was trained on:
scoring a conversation with a model trained on text rows reads its transcript (`turns.text_pair`), and a model
trained on conversations refuses text.

- Strength is a margin: with `use_margin` the row's ``margin`` column (0 / 0.5 / 1 for slight / clear / decisive)
  asks for r_chosen - r_rejected > margin, TRL's margin loss.
- Ties (rows with ``tie: true``, whose chosen/rejected order means nothing) are dropped (``ties="drop"``) or train
  with ``ties="tie_loss"``: the Bradley-Terry cross-entropy with the soft target 1/2,
  -1/2 log sigmoid(d) - 1/2 log sigmoid(-d), which is smallest at d = 0. We use it rather than Rao-Kupper because
  it keeps the one model every other label uses: P(a > b) stays sigmoid(r_a - r_b), so the probabilities that
  active selection, evaluation and the policy trainers read mean the same with or without ties. Rao-Kupper adds a
  learned threshold and a third outcome that every consumer would have to carry.
- Ensembles: `ensemble_size` K members, each from its own seed (head initialisation and batch order), or with
  ``ensemble_mode="bootstrap"`` each on a resample with replacement of the training pairs. The spread of the members'
  scores is the uncertainty that active query selection uses. Bradley-Terry fixes rewards only up to a constant, so
  each member of an ensemble is centred on its mean reward over a sample of its training completions; otherwise the
  spread would mostly measure offsets. A single model is not centred (its differences are all that count).
- Evaluation on held-out tasks (`split_by_task`): pairwise accuracy, log-loss and expected calibration error of the
  ensemble's P(chosen > rejected), overall and by the rows' ``pair_type``, beside the "shorter trajectory wins"
  baseline; tie rows are reported apart as their mean |P - 1/2|.

The run directory::

    output_dir/tandem_artifact.json      manifest: config, metrics, summary, members
    output_dir/members/<i>/              member i: an ordinary HF directory (safetensors, config, tokenizer)
                                         and tandem_member.json (seed, centring offset, what it trained on)
    output_dir/checkpoints/checkpoint-N  the member in training, for resume; removed when it is saved

A run called again on the same directory skips finished members and resumes the current one from its last
checkpoint; a finished directory returns its stored summary.

Defaults suit a tiny model on a CPU. For a 0.5-8B model on a GPU::

    python -m reward_models.reward --data_path preference.jsonl --base_model Qwen/Qwen2.5-0.5B-Instruct \\
        --output_dir var/models/rm --precision bf16 --learning_rate 1e-5 --batch_size 4 \\
        --gradient_accumulation_steps 8 --gradient_checkpointing true --max_length 4096 --num_epochs 1
    # 7-8B: add --use_lora true --lora_r 16 --learning_rate 1e-4 (the LoRA weights are merged into the saved model)
    # several GPUs: accelerate launch -m reward_models.reward ...

Example::

    from reward_models.reward import RewardConfig, load_reward_model, main

    summary = main(RewardConfig(data_path="pref.jsonl", base_model="var/policies/bootstrap", output_dir="var/rm"))
    model = load_reward_model("var/rm")
    mean, std = model.score([prompt], [completion])
    p, p_std = model.preference_probability(prompt, completion_a, completion_b)
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import (
    checkpoint_dir,
    finished_summary,
    last_checkpoint,
    read_manifest,
    trained_model,
    write_manifest,
)
from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, require
from reward_models.common.data import bad_rows, message_text, read_rows, row_tools, rows_error, split_by_task
from reward_models.common.judge_config import JudgeConfig, with_local_base
from reward_models.common.reporting import Reporter, SilentReporter, trainer_callback
from reward_models.common.runtime import resolve_precision, trainer_precision_args
from reward_models.policy.turns import JUDGE_LAYOUTS, judge_pair, text_pair
from reward_models.steps import rows_style

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

KIND = "reward_model"
MEMBERS_DIR = "members"
MEMBER_FILE = "tandem_member.json"
# Written into the checkpoint folder: which ensemble member its checkpoints belong to.
CHECKPOINT_OWNER_FILE = "tandem_member.json"
TIE_MODES = ("drop", "tie_loss")
# What the model reads of a trajectory: `reward_models.policy.turns.JUDGE_LAYOUTS` says what each layout keeps.
LAYOUTS = JUDGE_LAYOUTS
ENSEMBLE_MODES = ("seed", "bootstrap")
# Members are centred on their mean reward over at most this many training completions.
CENTRING_SAMPLE = 256

Conversation = str | Sequence[Mapping[str, Any]]
Tools = Sequence[dict[str, Any]] | None
# What a model was trained on, and so reads: message lists through the chat template, or text.
STYLES = ("conversational", "text")


@dataclass
class RewardConfig(JudgeConfig):
    # Labels
    use_margin: bool = field(
        default=True,
        metadata={"help": "Ask for r(chosen) - r(rejected) > the row's margin (its strength: 0, 0.5 or 1)."},
    )
    ties: str = field(
        default="drop",
        metadata={
            "choices": TIE_MODES,
            "help": "Tie rows: drop them, or tie_loss (Bradley-Terry with target 1/2, pulling r_a to r_b).",
        },
    )

    layout: str = field(
        default="full",
        metadata={
            "choices": LAYOUTS,
            "help": "What the model reads: full, decisions, actions or moves (reward_models.policy.turns says what "
            "each keeps); scoring applies the same layout.",
        },
    )

    # Ensemble
    ensemble_size: int = field(default=1, metadata={"help": "Members K; K > 1 gives each score an uncertainty."})
    ensemble_mode: str = field(
        default="seed",
        metadata={
            "choices": ENSEMBLE_MODES,
            "help": "seed: members differ by seed; bootstrap: each also trains on a resample of the pairs.",
        },
    )

    # Memory and speed on large models
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Batches per optimiser step (effective batch = batch_size x this x GPUs)."}
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward pass: less memory, ~30 % slower."}
    )

    # Evaluation
    ece_bins: int = field(default=10, metadata={"help": "Equal-width bins of the calibration error (ECE)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.ties in TIE_MODES, "ties", f"must be one of {', '.join(TIE_MODES)}, not {self.ties!r}")
        require(self.layout in LAYOUTS, "layout", f"must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        require(self.ensemble_size >= 1, "ensemble_size", "must be at least 1")
        require(
            self.ensemble_mode in ENSEMBLE_MODES,
            "ensemble_mode",
            f"must be one of {', '.join(ENSEMBLE_MODES)}, not {self.ensemble_mode!r}",
        )
        require(self.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be at least 1")
        require(self.ece_bins >= 1, "ece_bins", "must be at least 1")


# --- encoding ----------------------------------------------------------------------------------------------------


def _row_in_layout(row: dict[str, Any], layout: str) -> dict[str, Any]:
    if layout == "full" or isinstance(row["prompt"], str):
        return row
    prompt = row["prompt"]
    return {
        **row,
        "prompt": judge_pair(prompt, [], layout)[0],
        "chosen": judge_pair(prompt, row["chosen"], layout)[1],
        "rejected": judge_pair(prompt, row["rejected"], layout)[1],
    }


def encode(
    tokenizer: PreTrainedTokenizerBase, prompt: Conversation, completion: Conversation, tools: Tools = None
) -> list[int]:
    """Token ids of prompt + completion as the reward model reads them, the way TRL's `RewardTrainer` tokenises a
    preference row: conversations through the chat template with the row's `tools` (as one ``Role: content``
    transcript when the tokenizer has none), text as the concatenated string, ending in EOS when the tokenizer has
    one."""
    if isinstance(prompt, str) != isinstance(completion, str):
        raise ValueError("prompt and completion must both be text or both be message lists")
    if not isinstance(prompt, str) and tokenizer.chat_template:
        encoded = tokenizer.apply_chat_template(
            [*prompt, *completion], tools=list(tools) if tools else None, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    text = prompt + completion if isinstance(prompt, str) else message_text([*prompt, *completion])
    ids = list(tokenizer(text)["input_ids"])
    # The EOS id, not its string: a word-level tokenizer would read "...left<eos>" as one unknown word.
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_as_trained(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Conversation,
    completion: Conversation,
    tools: Tools,
    *,
    style: str,
    layout: str,
    max_length: int,
) -> list[int]:
    """Token ids of one example as a judge trained on rows of `style` in `layout` reads it: a conversation given
    to a judge trained on text rows is read as its transcript (`turns.text_pair`, the text export's form); text
    given to a judge trained on conversations is an error, since nothing can render it as the chat template did."""
    if style == "text" and not isinstance(prompt, str):
        prompt, completion = text_pair(prompt, completion)
    if style == "conversational" and isinstance(prompt, str):
        raise ValueError("this judge was trained on conversations (message lists) and cannot read text")
    prompt, completion = judge_pair(prompt, completion, layout)
    return fit_length(encode(tokenizer, prompt, completion, tools), max_length)


def fit_length(ids: list[int], max_length: int) -> list[int]:
    """Cut an over-long sequence in the middle: a trajectory's start (task, first observation) and its end (the
    outcome) say the most about it. TRL would drop the whole pair instead."""
    if len(ids) <= max_length:
        return ids
    head = max_length // 2
    return ids[:head] + ids[len(ids) - (max_length - head) :]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with EOS as the pad token when it has none (TRL's choice)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def rewards(model: PreTrainedModel, sequences: Sequence[list[int]], pad_token_id: int, batch_size: int) -> list[float]:
    """The model's reward for each token sequence. Batches are padded on the right, as TRL's collator pads them in
    training (whatever side the tokenizer pads), and the head reads the last token that is not padding; sorting by
    length keeps padding short."""
    import torch

    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda index: len(sequences[index]))
    scores = [0.0] * len(sequences)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            width = max(len(sequences[index]) for index in batch)
            input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, index in enumerate(batch):
                ids = sequences[index]
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention_mask[row, : len(ids)] = 1
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False
            ).logits
            for row, index in enumerate(batch):
                scores[index] = float(logits[row, 0])
    model.train(was_training)
    return scores


# --- the loader --------------------------------------------------------------------------------------------------


class RewardModel:
    """A trained reward model or ensemble. `score` gives each completion's reward (the members' mean, each member
    centred) and its spread; `preference_probability` gives P(a > b) as the members' mean sigmoid(r_a - r_b).
    ``tools`` (one list of tool schemas, or None, per example) go to the chat template, as the rows' did in training.

    >>> model = load_reward_model("var/models/rm")  # doctest: +SKIP
    >>> mean, std = model.score([prompt, prompt], [completion_a, completion_b])  # doctest: +SKIP
    """

    def __init__(
        self,
        members: Sequence[PreTrainedModel],
        tokenizer: PreTrainedTokenizerBase,
        offsets: Sequence[float],
        max_length: int,
        batch_size: int = 16,
        layout: str = "full",
        style: str = "conversational",
    ) -> None:
        if style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
        self.members = list(members)
        self.layout = layout
        self.style = style
        self.tokenizer = tokenizer
        self.offsets = list(offsets)
        self.max_length = max_length
        self.batch_size = batch_size

    def encode(self, prompt: Conversation, completion: Conversation, tools: Tools = None) -> list[int]:
        return encode_as_trained(
            self.tokenizer, prompt, completion, tools, style=self.style, layout=self.layout, max_length=self.max_length
        )

    def member_rewards(
        self, prompts: Sequence[Conversation], completions: Sequence[Conversation], tools: Sequence[Tools] = ()
    ) -> list[list[float]]:
        """Each member's centred rewards: ``[member][example]``."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        offered = list(tools) or [None] * len(prompts)
        sequences = [
            self.encode(prompt, completion, example_tools)
            for prompt, completion, example_tools in zip(prompts, completions, offered, strict=True)
        ]
        return [
            [reward - offset for reward in rewards(member, sequences, _pad_id(member), self.batch_size)]
            for member, offset in zip(self.members, self.offsets, strict=True)
        ]

    def score(
        self, prompts: Sequence[Conversation], completions: Sequence[Conversation], tools: Sequence[Tools] = ()
    ) -> tuple[list[float], list[float] | None]:
        """(mean reward, members' standard deviation) per completion; the deviation is None for one member."""
        per_member = self.member_rewards(prompts, completions, tools)
        return _mean_and_std(per_member)

    def preference_probability(
        self, prompt: Conversation, a: Conversation, b: Conversation, tools: Tools = None
    ) -> tuple[float, float | None]:
        """P(a > b) after `prompt`, and the members' standard deviation of it (None for one member)."""
        probabilities, spread = self.preference_probabilities([prompt], [a], [b], [tools])
        return probabilities[0], None if spread is None else spread[0]

    def preference_probabilities(
        self,
        prompts: Sequence[Conversation],
        a: Sequence[Conversation],
        b: Sequence[Conversation],
        tools: Sequence[Tools] = (),
    ) -> tuple[list[float], list[float] | None]:
        """`preference_probability` for many pairs at once."""
        offered = list(tools) or [None] * len(prompts)
        per_member = self.member_rewards([*prompts, *prompts], [*a, *b], [*offered, *offered])
        n = len(prompts)
        return _mean_and_std([[_sigmoid(r[i] - r[n + i]) for i in range(n)] for r in per_member])


def load_reward_model(path: str | Path, device: str | None = None) -> RewardModel:
    """The reward model (every ensemble member) that `main` wrote to `path`, on `device` (default: CUDA if there
    is one)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("kind") != KIND:
        raise ValueError(f"{path} holds a {manifest.get('kind')!r}, not a reward model")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    members, offsets = [], []
    for member in manifest["members"]:
        member_dir = path / member
        members.append(AutoModelForSequenceClassification.from_pretrained(str(member_dir)).to(device).eval())
        offsets.append(json.loads((member_dir / MEMBER_FILE).read_text())["offset"])
    tokenizer = load_tokenizer(path / manifest["members"][0])
    config = manifest["config"]
    # A model written before the manifest recorded its style trained on the default, conversational rows.
    return RewardModel(
        members,
        tokenizer,
        offsets,
        config["max_length"],
        config["batch_size"],
        config.get("layout", "full"),
        manifest.get("style", "conversational"),
    )


# --- evaluation --------------------------------------------------------------------------------------------------


def evaluate(model: RewardModel, rows: Sequence[Mapping[str, Any]], ece_bins: int = 10) -> dict[str, Any]:
    """Held-out figures of `model` on preference rows (see `pairwise_metrics`)."""
    prompts = [row["prompt"] for row in rows]
    tools = [row_tools(row) for row in rows]
    chosen = model.member_rewards(prompts, [row["chosen"] for row in rows], tools)
    rejected = model.member_rewards(prompts, [row["rejected"] for row in rows], tools)
    differences = [[c - r for c, r in zip(cs, rs, strict=True)] for cs, rs in zip(chosen, rejected, strict=True)]
    return pairwise_metrics(differences, rows, _length_gaps(model.tokenizer, rows), ece_bins)


def pairwise_metrics(
    differences: Sequence[Sequence[float]],
    rows: Sequence[Mapping[str, Any]],
    length_gaps: Sequence[int],
    ece_bins: int,
) -> dict[str, Any]:
    """Accuracy, log-loss and ECE of the ensemble's P(chosen > rejected) = mean over members of
    sigmoid(r_chosen - r_rejected), from `differences[member][row]`, overall and by ``pair_type``; the "shorter
    trajectory wins" baseline from `length_gaps` (tokens of chosen minus rejected); tie rows apart as their mean
    |P - 1/2|. A probability of exactly 1/2 counts as half right."""
    probabilities, spread = _mean_and_std([[_sigmoid(d) for d in member] for member in differences])
    ties = [index for index, row in enumerate(rows) if row.get("tie")]
    strict = [index for index, row in enumerate(rows) if not row.get("tie")]
    metrics: dict[str, Any] = _pair_figures(
        [probabilities[i] for i in strict], [length_gaps[i] for i in strict], ece_bins
    )
    if spread is not None:
        metrics["mean_member_std"] = _mean(spread)
    by_type: dict[str, list[int]] = {}
    for index in strict:
        if rows[index].get("pair_type"):
            by_type.setdefault(str(rows[index]["pair_type"]), []).append(index)
    if by_type:
        metrics["by_pair_type"] = {
            name: _pair_figures([probabilities[i] for i in indices], [length_gaps[i] for i in indices], ece_bins)
            for name, indices in sorted(by_type.items())
        }
    metrics["tie_pairs"] = len(ties)
    if ties:
        metrics["tie_mean_abs_gap"] = _mean([abs(probabilities[i] - 0.5) for i in ties])
    return metrics


def _pair_figures(probabilities: Sequence[float], length_gaps: Sequence[int], ece_bins: int) -> dict[str, Any]:
    if not probabilities:
        return {"pairs": 0}
    shorter_wins = [1.0 if gap < 0 else 0.0 if gap > 0 else 0.5 for gap in length_gaps]
    return {
        "pairs": len(probabilities),
        "accuracy": _mean([1.0 if p > 0.5 else 0.0 if p < 0.5 else 0.5 for p in probabilities]),
        "log_loss": _mean([-math.log(max(p, 1e-12)) for p in probabilities]),
        "ece": expected_calibration_error(probabilities, ece_bins),
        "shorter_wins_accuracy": _mean(shorter_wins),
    }


def expected_calibration_error(probabilities: Sequence[float], bins: int = 10) -> float:
    """ECE of P(chosen > rejected) over `bins` equal-width bins of [0, 1]. A pair's order is arbitrary, so each pair
    counts twice, as (p, chosen won) and (1 - p, rejected lost); otherwise every outcome would be "the first won"
    and the figure would only measure how close to 1 the probabilities are."""
    points = [(p, 1.0) for p in probabilities] + [(1.0 - p, 0.0) for p in probabilities]
    totals: dict[int, list[float]] = {}
    for p, outcome in points:
        slot = totals.setdefault(min(int(p * bins), bins - 1), [0.0, 0.0, 0.0])
        slot[0] += p
        slot[1] += outcome
        slot[2] += 1
    return sum(abs(p_sum - won) for p_sum, won, _ in totals.values()) / len(points)


def _length_gaps(tokenizer: PreTrainedTokenizerBase, rows: Sequence[Mapping[str, Any]]) -> list[int]:
    return [
        len(encode(tokenizer, row["prompt"], row["chosen"], row_tools(row)))
        - len(encode(tokenizer, row["prompt"], row["rejected"], row_tools(row)))
        for row in rows
    ]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _mean_and_std(per_member: Sequence[Sequence[float]]) -> tuple[list[float], list[float] | None]:
    """Column means over members and, for more than one member, their population standard deviation."""
    columns = list(zip(*per_member, strict=True))
    means = [_mean(column) for column in columns]
    if len(per_member) == 1:
        return means, None
    stds = [math.sqrt(_mean([(v - m) ** 2 for v in column])) for column, m in zip(columns, means, strict=True)]
    return means, stds


def _pad_id(model: PreTrainedModel) -> int:
    return model.config.get_text_config().pad_token_id


# --- training ----------------------------------------------------------------------------------------------------


def _tandem_reward_trainer():
    """`RewardTrainer` that keeps a ``tie`` column and trains tie rows towards P = 1/2 (built on first use, so that
    importing this module does not import TRL)."""
    import torch
    import torch.nn.functional as F
    from trl import RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    @dataclass
    class TiePreferenceCollator(DataCollatorForPreference):
        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            batch = super().torch_call(examples)
            batch["tie"] = torch.tensor([bool(example["tie"]) for example in examples])
            return batch

    class TandemRewardTrainer(RewardTrainer):
        """Without a ``tie`` column this is TRL's `RewardTrainer` unchanged; with one (``ties="tie_loss"``), tie
        rows take -1/2 log sigmoid(d) - 1/2 log sigmoid(-d) and the others TRL's margin loss, and accuracy counts
        the others only."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.with_ties = "tie" in kwargs["train_dataset"].column_names
            if self.with_ties:
                kwargs["data_collator"] = TiePreferenceCollator(pad_token_id=kwargs["processing_class"].pad_token_id)
            super().__init__(*args, **kwargs)

        def _set_signature_columns_if_needed(self) -> None:
            if self._signature_columns is None:
                self._signature_columns = ["chosen_ids", "rejected_ids", "margin", "tie"]

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if "tie" not in inputs:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            mode = "train" if self.model.training else "eval"
            tie = inputs["tie"]
            outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
            chosen, rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
            difference = chosen - rejected
            shifted = difference - inputs["margin"] if "margin" in inputs else difference
            preference_loss = -F.logsigmoid(shifted)
            tie_loss = -0.5 * (F.logsigmoid(difference) + F.logsigmoid(-difference))
            loss = torch.where(tie, tie_loss, preference_loss).mean()
            with torch.no_grad():
                gather = self.accelerator.gather_for_metrics
                self._metrics[mode]["mean_reward"].append(gather(outputs.logits).mean().item())
                strict = gather(~tie)
                correct = gather((difference > 0) & ~tie)
                if strict.any():
                    self._metrics[mode]["accuracy"].append((correct.sum() / strict.sum()).item())
                gaps = gather(torch.where(tie, difference.abs(), torch.zeros_like(difference)))
                if (~strict).any():
                    self._metrics[mode]["tie_gap"].append((gaps.sum() / (~strict).sum()).item())
            return (loss, outputs) if return_outputs else loss

    return TandemRewardTrainer


@dataclass
class _Pairs:
    """A split's rows, tokenised once: what `datasets` gets, and what evaluation scores."""

    rows: list[dict[str, Any]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    length_gaps: list[int]
    truncated: int


def _encode_rows(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], max_length: int) -> _Pairs:
    chosen_ids, rejected_ids, gaps, truncated = [], [], [], 0
    for row in rows:
        chosen = encode(tokenizer, row["prompt"], row["chosen"], row_tools(row))
        rejected = encode(tokenizer, row["prompt"], row["rejected"], row_tools(row))
        gaps.append(len(chosen) - len(rejected))
        truncated += len(chosen) > max_length or len(rejected) > max_length
        chosen_ids.append(fit_length(chosen, max_length))
        rejected_ids.append(fit_length(rejected, max_length))
    return _Pairs(rows, chosen_ids, rejected_ids, gaps, truncated)


def row_problems(rows: Sequence[dict[str, Any]], config: RewardConfig) -> dict[int, str]:
    """The rows the reward model cannot learn from, by number, and why."""
    return bad_rows(rows, preference_row_problem)


def preference_row_problem(row: dict[str, Any]) -> str | None:
    """Why a `preference` row is no comparison a pairwise judge can read, or None: it needs a prompt, chosen and
    rejected, all text or all message lists."""
    for column in ("prompt", "chosen", "rejected"):
        if not row.get(column):
            return f"it has no {column!r} (a preference export has prompt, chosen, rejected)"
    if len({isinstance(row[column], str) for column in ("prompt", "chosen", "rejected")}) > 1:
        return "it mixes text and message lists"
    return None


class _MemberReporter:
    """Member i of K reports its steps as steps i*n+1 .. (i+1)*n of one run of K*n steps."""

    def __init__(self, reporter: Reporter, member: int, members: int) -> None:
        self.reporter, self.member, self.members, self.steps = reporter, member, members, 0

    def progress(self, current: int, total: int, phase: str = "") -> None:
        if phase:
            self.reporter.progress(current, total, phase)
            return
        self.steps = total
        self.reporter.progress(self.member * total + current, self.members * total)

    def metric(self, step: int, **values: float) -> None:
        self.reporter.metric(self.member * self.steps + step, member=self.member, **values)

    def log(self, line: str) -> None:
        self.reporter.log(line)


def _train_member(
    config: RewardConfig,
    member: int,
    train: _Pairs,
    evaluation: _Pairs,
    tokenizer: PreTrainedTokenizerBase,
    precision: str,
    reporter: Reporter,
) -> tuple[dict[str, Any], str | None]:
    """Train, centre, score the held-out pairs with and save ensemble member `member`; returns its record (also
    written as its ``tandem_member.json``) and the checkpoint it resumed from."""
    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import TrainerState
    from transformers.trainer_callback import PrinterCallback
    from trl import RewardConfig as TRLRewardConfig

    output_dir = Path(config.output_dir)
    seed = config.seed + member
    n = len(train.rows)
    if config.ensemble_mode == "bootstrap":
        sampler = random.Random(seed)
        indices = [sampler.randrange(n) for _ in range(n)]
    else:
        indices = list(range(n))
    columns: dict[str, list[Any]] = {
        "chosen_ids": [train.chosen_ids[i] for i in indices],
        "rejected_ids": [train.rejected_ids[i] for i in indices],
    }
    if config.use_margin:
        columns["margin"] = [float(train.rows[i].get("margin") or 0.0) for i in indices]
    if config.ties == "tie_loss":
        columns["tie"] = [bool(train.rows[i].get("tie")) for i in indices]

    # Checkpoints belong to the member being trained; ones left by another member (a crash between saving a member
    # and clearing its checkpoints) must not be resumed.
    checkpoints = checkpoint_dir(output_dir)
    owner_file = checkpoints / CHECKPOINT_OWNER_FILE
    state = PartialState()  # under `accelerate launch`, one process writes files and the others wait
    if state.is_main_process:
        if owner_file.is_file() and json.loads(owner_file.read_text())["member"] != member:
            shutil.rmtree(checkpoints)
        checkpoints.mkdir(parents=True, exist_ok=True)
        owner_file.write_text(json.dumps({"member": member}) + "\n")
    state.wait_for_everyone()
    resume = last_checkpoint(output_dir)
    start_step = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json")).global_step if resume else 0

    peft_config, model_init_kwargs = None, None
    if config.use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="SEQ_CLS", r=config.lora_r, lora_alpha=2 * config.lora_r)
        if precision == "bf16":
            # The frozen base in bf16 is what makes LoRA fit a 7-8B model on one GPU; peft keeps the adapters fp32.
            model_init_kwargs = {"dtype": torch.bfloat16}
    args = TRLRewardConfig(
        output_dir=str(checkpoints),
        model_init_kwargs=model_init_kwargs,
        seed=seed,
        num_train_epochs=config.num_epochs,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        activation_checkpointing=config.gradient_checkpointing,  # its name in transformers 5
        max_length=None,  # already cut to max_length by fit_length
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        logging_steps=config.logging_steps,
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        **trainer_precision_args(precision),
    )
    member_reporter = (
        reporter if config.ensemble_size == 1 else _MemberReporter(reporter, member, config.ensemble_size)
    )
    trainer = _tandem_reward_trainer()(
        model=config.base_model,
        args=args,
        train_dataset=Dataset.from_dict(columns),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[trainer_callback(member_reporter)],
    )
    # The reporter shows progress and metrics; the default printer would put log dicts on stdout, where the
    # command line prints its JSON summary.
    trainer.remove_callback(PrinterCallback)
    if resume:
        reporter.log(f"member {member}: resuming from {resume}")
    reporter.log(f"member {member}: training on {n} pairs ({len(set(indices))} distinct), seed {seed}")
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - started
    steps = trainer.state.global_step - start_step
    world = trainer.accelerator.num_processes
    # Counted in full batches: an epoch's last, partial batch counts as full.
    samples = steps * config.batch_size * config.gradient_accumulation_steps * world

    model = trained_model(trainer.accelerator, trainer.model)
    model = model.merge_and_unload() if config.use_lora else model
    pad_id = _pad_id(model)
    offset = 0.0
    if config.ensemble_size > 1:  # one model's scores need no common zero: only their differences mean anything
        centring = random.Random(seed).sample(indices, min(len(indices), CENTRING_SAMPLE // 2))
        sample = [train.chosen_ids[i] for i in centring] + [train.rejected_ids[i] for i in centring]
        offset = _mean(rewards(model, sample, pad_id, config.batch_size))
    eval_chosen = rewards(model, evaluation.chosen_ids, pad_id, config.batch_size)
    eval_rejected = rewards(model, evaluation.rejected_ids, pad_id, config.batch_size)
    record = {
        "member": member,
        "seed": seed,
        "offset": offset,
        "train_pairs": n,
        "distinct_pairs": len(set(indices)),
        "data_digest": hashlib.sha256(json.dumps(sorted(indices)).encode()).hexdigest()[:16],
        "steps": trainer.state.global_step,
        "train_seconds": seconds,
        "trained_samples": samples,
        "eval_differences": [c - r for c, r in zip(eval_chosen, eval_rejected, strict=True)],
    }
    member_dir = output_dir / MEMBERS_DIR / str(member)
    if trainer.args.should_save:
        partial = member_dir.with_name(member_dir.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        (partial / MEMBER_FILE).write_text(json.dumps(record) + "\n")
        partial.replace(member_dir)
        shutil.rmtree(checkpoints)
    trainer.accelerator.wait_for_everyone()
    return record, resume


def main(config: RewardConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train the reward model (or ensemble) on `config.data_path`, evaluate it on the held-out tasks and write
    `config.output_dir`; returns the summary (also kept in the manifest)."""
    reporter = reporter or SilentReporter()
    finished = finished_summary(config, KIND)
    if finished is not None:
        reporter.log(f"{config.output_dir} already holds this reward model; not training again")
        return finished
    precision = resolve_precision(config.precision)
    local = with_local_base(config)  # a hub id read from the local cache
    rows = read_rows(config.data_path)
    if not rows:
        raise ConfigError("data_path", "holds no rows")
    if problems := row_problems(rows, config):
        raise rows_error(problems, len(rows))
    style = rows_style(rows)
    rows = [_row_in_layout(row, config.layout) for row in rows]
    train_rows, eval_rows = split_by_task(rows, config.eval_fraction, config.seed)
    dropped_ties = 0
    if config.ties == "drop":
        dropped_ties = sum(bool(row.get("tie")) for row in train_rows)
        train_rows = [row for row in train_rows if not row.get("tie")]
    if not train_rows:
        raise ConfigError("data_path", "leaves no comparisons to train on after the held-out split and dropped ties")
    from accelerate import PartialState

    tokenizer = load_tokenizer(local.base_model)
    train = _encode_rows(tokenizer, train_rows, config.max_length)
    evaluation = _encode_rows(tokenizer, eval_rows, config.max_length)
    reporter.log(
        f"{len(train_rows)} training pairs ({dropped_ties} ties dropped), {len(eval_rows)} held out, "
        f"{train.truncated + evaluation.truncated} cut to {config.max_length} tokens; precision {precision}"
    )

    records, resumed_from = [], None
    for member in range(config.ensemble_size):
        member_file = Path(config.output_dir) / MEMBERS_DIR / str(member) / MEMBER_FILE
        if member_file.is_file():
            reporter.log(f"member {member}: already trained")
            records.append(json.loads(member_file.read_text()))
            continue
        record, resume = _train_member(local, member, train, evaluation, tokenizer, precision, reporter)
        records.append(record)
        resumed_from = resumed_from or resume

    metrics = (
        pairwise_metrics([r["eval_differences"] for r in records], eval_rows, evaluation.length_gaps, config.ece_bins)
        if eval_rows
        else {}
    )
    train_seconds = sum(record["train_seconds"] for record in records)
    trained_samples = sum(record["trained_samples"] for record in records)
    summary = {
        "metrics": metrics,
        "train_samples": len(train_rows),
        "eval_samples": len(eval_rows),
        "dropped_ties": dropped_ties,
        "truncated_pairs": train.truncated + evaluation.truncated,
        "train_seconds": train_seconds,
        "samples_per_second": trained_samples / train_seconds if train_seconds else 0.0,
        "output_dir": str(config.output_dir),
        "resumed_from": resumed_from,
        "members": [{key: value for key, value in record.items() if key != "eval_differences"} for record in records],
    }
    if PartialState().is_main_process:
        write_manifest(
            config.output_dir,
            kind=KIND,
            config=config,
            metrics=metrics,
            summary=summary,
            members=[f"{MEMBERS_DIR}/{member}" for member in range(config.ensemble_size)],
            precision=precision,
            style=style,
        )
    if metrics:
        reporter.log(
            f"held out: accuracy {metrics.get('accuracy', float('nan')):.3f}, "
            f"log-loss {metrics.get('log_loss', float('nan')):.3f}, ECE {metrics.get('ece', float('nan')):.3f}"
        )
    return summary


if __name__ == "__main__":
    cli(RewardConfig, main, __doc__)
