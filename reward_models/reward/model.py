"""A trained reward model or ensemble, loaded: each completion's reward and its spread over members, P(a > b),
and held-out evaluation on preference rows. torch and transformers are imported inside the functions."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import read_manifest
from reward_models.common.batching import right_padded
from reward_models.common.data import row_tools
from reward_models.reward.config import KIND, MEMBER_FILE
from reward_models.reward.encoding import STYLES, Conversation, Tools, TrainedEncoding, encode, load_tokenizer
from reward_models.reward.metrics import mean_and_std, pairwise_metrics, sigmoid

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def rewards(model: PreTrainedModel, sequences: Sequence[list[int]], pad_token_id: int, batch_size: int) -> list[float]:
    """The model's reward for each token sequence. Batches are padded on the right, as TRL's collator pads them in
    training (whatever side the tokenizer pads), and the head reads the last token that is not padding; sorting by
    length keeps padding short."""
    import torch

    device = next(model.parameters()).device
    scores = [0.0] * len(sequences)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch, input_ids, attention_mask in right_padded(sequences, batch_size, pad_token_id):
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False
            ).logits
            for row, index in enumerate(batch):
                scores[index] = float(logits[row, 0])
    model.train(was_training)
    return scores


def model_pad_id(model: PreTrainedModel) -> int:
    """The pad token id the model's config records, which `rewards` pads with."""
    return model.config.get_text_config().pad_token_id


class RewardModel(TrainedEncoding):
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

    def member_rewards(
        self, prompts: Sequence[Conversation], completions: Sequence[Conversation], tools: Sequence[Tools] = ()
    ) -> list[list[float]]:
        """Each member's centred rewards: ``[member][example]``."""
        sequences = self.encode_all(prompts, completions, tools)
        return [
            [reward - offset for reward in rewards(member, sequences, model_pad_id(member), self.batch_size)]
            for member, offset in zip(self.members, self.offsets, strict=True)
        ]

    def score(
        self, prompts: Sequence[Conversation], completions: Sequence[Conversation], tools: Sequence[Tools] = ()
    ) -> tuple[list[float], list[float] | None]:
        """(mean reward, members' standard deviation) per completion; the deviation is None for one member."""
        per_member = self.member_rewards(prompts, completions, tools)
        return mean_and_std(per_member)

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
        return mean_and_std([[sigmoid(r[i] - r[n + i]) for i in range(n)] for r in per_member])


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


def _length_gaps(tokenizer: PreTrainedTokenizerBase, rows: Sequence[Mapping[str, Any]]) -> list[int]:
    return [
        len(encode(tokenizer, row["prompt"], row["chosen"], row_tools(row)))
        - len(encode(tokenizer, row["prompt"], row["rejected"], row_tools(row)))
        for row in rows
    ]
