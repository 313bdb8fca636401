"""Checks of where a policy loss sends its gradient, shared by the tests of the trainers that score each assistant
turn after its own prompt (step-level DPO, KTO): only the turn's tokens are trained, never the observations."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Tokens of the gridworld's rendered observation (floor, wall, agent, row separator).
OBSERVATION_TEXT = ". # A |"


def assert_gradient_on_completions(gradient: torch.Tensor, completion_mask: torch.Tensor) -> None:
    """`gradient`, the size of the final hidden state's gradient at each position, is positive exactly where the
    next token is a completion token: the hidden state at position t feeds only the prediction of token t + 1."""
    predicts_completion = torch.zeros_like(completion_mask, dtype=torch.bool)
    predicts_completion[:, :-1] = completion_mask[:, 1:].bool()
    assert (gradient[predicts_completion] > 0).all()
    assert (gradient[~predicts_completion] == 0).all()


def assert_prompts_show_observations(tokenizer, input_ids: torch.Tensor, prompts: Sequence[list[int]]) -> None:
    """Each batch row of `input_ids` starts with its prompt's ids, and that prompt shows an observation."""
    observation_ids = set(tokenizer(OBSERVATION_TEXT, add_special_tokens=False)["input_ids"])
    for row, prompt_ids in zip(input_ids, prompts, strict=True):
        prompt = row[: len(prompt_ids)].tolist()
        assert prompt == prompt_ids and observation_ids & set(prompt)
