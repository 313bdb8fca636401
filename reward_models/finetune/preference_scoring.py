"""P(a > b) from a trained judge: the skew-symmetric pairwise score of the preference model's heads, the preference
model loaded for scoring, and a Bradley-Terry reward model behind the same interface (`load_preference_model` reads
either directory).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.artifacts import read_manifest
from reward_models.common.batching import right_padded
from reward_models.common.config import ConfigError
from reward_models.policy.turns import judge_pair
from reward_models.reward.encoding import TrainedEncoding

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


KIND = "preference_model"

Conversation = str | Sequence[Mapping[str, Any]]
Pair = tuple[Conversation, Conversation, Conversation]  # (prompt, a, b)
Tools = Sequence[dict[str, Any]] | None


def pair_scores(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """s(a, b) for rows of head outputs ``[u, z_0, z_1, ...]`` (shape (..., 1 + 2k)); antisymmetric in its
    arguments, so sigmoid of it is P(a > b) with P(a > b) + P(b > a) = 1."""
    score = first[..., 0] - second[..., 0]
    if first.shape[-1] > 1:
        za, zb = first[..., 1:], second[..., 1:]
        score = score + (za[..., 0::2] * zb[..., 1::2] - za[..., 1::2] * zb[..., 0::2]).sum(-1)
    return score


class PreferenceModel(TrainedEncoding):
    """P(a > b) between completions of the same prompt.

    >>> model = load_preference_model("var/models/preference")  # doctest: +SKIP
    >>> model.probability([(prompt, trajectory_a, trajectory_b)])  # doctest: +SKIP
    [0.93]
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        layout: str = "full",
        max_length: int = 1024,
        batch_size: int = 16,
        style: str = "conversational",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.layout = layout
        self.max_length = max_length
        self.batch_size = batch_size
        self.style = style

    def heads(
        self, prompts: Sequence[Conversation], completions: Sequence[Conversation], tools: Sequence[Tools] = ()
    ) -> torch.Tensor:
        """(N, 1 + 2k) head outputs, one row per completion (no gradient)."""
        import torch

        sequences = self.encode_all(prompts, completions, tools)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = forward_heads(self.model, sequences, self.batch_size)
        self.model.train(was_training)
        return out

    def probability(self, pairs: Sequence[Pair], tools: Sequence[Tools] = ()) -> list[float]:
        """P(a > b) for each ``(prompt, a, b)`` (with `tools`, one list of tool schemas or None per pair, for the
        chat template); each distinct completion is encoded once."""
        if not pairs:
            return []
        offered = list(tools) or [None] * len(pairs)
        index: dict[str, int] = {}
        prompts, completions, example_tools = [], [], []
        keys = []
        for (prompt, a, b), pair_tools in zip(pairs, offered, strict=True):
            row = []
            for completion in (a, b):
                key = repr((prompt, completion, pair_tools))
                if key not in index:
                    index[key] = len(prompts)
                    prompts.append(prompt)
                    completions.append(completion)
                    example_tools.append(pair_tools)
                row.append(index[key])
            keys.append(row)
        heads = self.heads(prompts, completions, example_tools)
        first = heads[[a for a, _ in keys]]
        second = heads[[b for _, b in keys]]
        return pair_scores(first, second).sigmoid().tolist()

    def win_matrix(
        self, prompt: Conversation, completions: Sequence[Conversation], tools: Tools = None
    ) -> list[list[float]]:
        """``[i][j]`` = P(completion i > completion j) for the completions of one prompt (1/2 on the diagonal)."""
        heads = self.heads([prompt] * len(completions), completions, [tools] * len(completions))
        return pair_scores(heads[:, None, :], heads[None, :, :]).sigmoid().tolist()


class RewardModelPreference:
    """A Bradley-Terry reward model (`reward_models.reward`) behind the preference-model interface."""

    def __init__(self, reward_model: Any, layout: str = "full") -> None:
        self.reward_model = reward_model
        self.layout = layout

    def probability(self, pairs: Sequence[Pair], tools: Sequence[Tools] = ()) -> list[float]:
        if not pairs:
            return []
        laid = [(judge_pair(p, a, self.layout), judge_pair(p, b, self.layout)) for p, a, b in pairs]
        probabilities, _ = self.reward_model.preference_probabilities(
            [pa[0] for pa, _ in laid], [pa[1] for pa, _ in laid], [pb[1] for _, pb in laid], tools
        )
        return probabilities

    def win_matrix(
        self, prompt: Conversation, completions: Sequence[Conversation], tools: Tools = None
    ) -> list[list[float]]:
        laid = [judge_pair(prompt, completion, self.layout) for completion in completions]
        scores, _ = self.reward_model.score([p for p, _ in laid], [c for _, c in laid], [tools] * len(laid))
        return [[_sigmoid(a - b) for b in scores] for a in scores]


def load_preference_model(
    path: str | Path, device: str | None = None, *, layout: str | None = None
) -> PreferenceModel | RewardModelPreference:
    """The preference model in `path`: one this module trained, or a Bradley-Terry reward model directory (P(a > b)
    = sigmoid(r_a - r_b)). `layout` overrides the stored one (a reward model stores none: default ``full``)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    path = Path(path)
    try:
        manifest = read_manifest(path)
    except FileNotFoundError as exc:
        raise ConfigError("preference_model_path", str(exc)) from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if manifest.get("kind") == "reward_model":
        from reward_models.reward.model import load_reward_model

        return RewardModelPreference(load_reward_model(path, device), layout or "full")
    if manifest.get("kind") != KIND:
        raise ConfigError(
            "preference_model_path", f"{path} holds a {manifest.get('kind')!r}, not a preference or reward model"
        )
    from reward_models.reward.encoding import load_tokenizer

    config = manifest["config"]
    model = AutoModelForSequenceClassification.from_pretrained(str(path / "model")).to(device).eval()
    return PreferenceModel(
        model,
        load_tokenizer(path / "model"),
        layout=layout or config["layout"],
        max_length=config["max_length"],
        batch_size=config["batch_size"],
        # A model written before the manifest recorded its style trained on the default, conversational rows.
        style=manifest.get("style", "conversational"),
    )


def forward_heads(model: PreTrainedModel, sequences: Sequence[list[int]], batch_size: int) -> torch.Tensor:
    """Head outputs for token sequences, right-padded in length-sorted batches (the head reads the last token that
    is not padding); with gradient when the caller has it on."""
    import torch
    from accelerate.utils import extract_model_from_parallel

    device = next(model.parameters()).device
    pad = extract_model_from_parallel(model).config.get_text_config().pad_token_id
    pieces, placed = [], []
    for batch, input_ids, attention_mask in right_padded(sequences, batch_size, pad):
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
        pieces.append(logits.logits.float())
        placed += batch
    out = torch.cat(pieces)
    inverse = torch.empty(len(placed), dtype=torch.long)
    inverse[torch.tensor(placed)] = torch.arange(len(placed))
    return out[inverse.to(out.device)]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
