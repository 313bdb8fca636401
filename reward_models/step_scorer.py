"""Reading a trained per-step head at every step of trajectories: what the process reward model
(`reward_models.prm`) and the value critic (`reward_models.value`) share once loaded. A `StepScorer` takes a
trajectory as the stepwise and returns exports lay it out (a prompt and one piece per step), or as a conversation it
first lays out in the style the head trained on (`reward_models.steps.trajectory_steps`), and gives one number per
step; a subclass says which number a step's head outputs make (`from_outputs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reward_models.common.data import row_tools
from reward_models.conversation import Message
from reward_models.steps import Pieces, Prompt, Tools, read_steps, step_style, trajectory_steps

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class StepScorer:
    """A per-step head with its tokenizer, scoring `batch_size` windows at a time."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 16) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.style = step_style(model)  # the rows it trained on: conversational or text

    def from_outputs(self, outputs: torch.Tensor) -> list[float]:
        """One number per step from the head's outputs at a trajectory's steps (shape ``(steps, num_labels)``)."""
        raise NotImplementedError

    def score_trajectory(self, prompt: Prompt, completions: Pieces, tools: Tools = None) -> list[float]:
        """One number per step piece of one trajectory (the export's `prompt`, `completions` and `tools`)."""
        return self.score_trajectories([(prompt, completions)], [tools])[0]

    def score_trajectories(
        self, trajectories: Sequence[tuple[Prompt, Pieces]], tools: Sequence[Tools] = ()
    ) -> list[list[float]]:
        """`score_trajectory` for many ``(prompt, completions)`` at once, with `tools` one list of tool schemas or
        None per trajectory."""
        outputs = read_steps(self.model, self.tokenizer, trajectories, self.batch_size, tools)
        return [self.from_outputs(output) for output in outputs]

    def score_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        """`score_trajectories` of export rows: each row's ``prompt`` and ``completions``, with its ``tools``."""
        return self.score_trajectories(
            [(row["prompt"], row["completions"]) for row in rows], [row_tools(row) for row in rows]
        )

    def score_conversations(
        self, conversations: Sequence[Sequence[Message]], tools: Sequence[Tools] = ()
    ) -> list[list[float]]:
        """One number after every assistant turn of each trajectory conversation, laid out as the exports lay out a
        trajectory with every step present, in the style the head trained on."""
        return self.score_trajectories([trajectory_steps(messages, self.style) for messages in conversations], tools)
