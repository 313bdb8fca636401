"""What the Nash-style trainers optimise: the preference pair two episodes of a task make, SPO's win rates and
group advantages, and the REINFORCE losses (with Nash-MD's KL penalty to the reference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from reward_models.rollout import episode_messages

if TYPE_CHECKING:
    import torch

    from reward_models.rollout import Episode


def preference_pair(episode: Episode, opponent: Episode) -> tuple[list, list, list]:
    """``(prompt, ours, theirs)`` as the `preference` export lays out two trajectories of one task: the shared
    prompt, then the rest of each conversation (every turn, tool result and observation, the final one included)."""
    cut = len(episode.prompt)
    return episode.prompt, episode_messages(episode)[cut:], episode_messages(opponent)[cut:]


def win_rates(matrix: Sequence[Sequence[float]]) -> list[float]:
    """Each sample's mean P(i > j) over the other samples j of its group (SPO's reward)."""
    k = len(matrix)
    if k < 2:
        raise ValueError("win rates need at least two samples")
    return [sum(matrix[i][j] for j in range(k) if j != i) / (k - 1) for i in range(k)]


def group_advantages(rewards: Sequence[float], scale: bool = False) -> list[float]:
    """Rewards minus their group mean (divided by the group's standard deviation when `scale`, unless it is 0)."""
    mean = sum(rewards) / len(rewards)
    centred = [reward - mean for reward in rewards]
    if scale:
        std = math.sqrt(sum(value * value for value in centred) / len(centred))
        if std > 1e-8:
            return [value / std for value in centred]
    return centred


def reinforce_loss(logprobs: torch.Tensor, coefficients: torch.Tensor, episodes: int) -> torch.Tensor:
    """SPO's summed loss of a batch of turns: `logprobs` (B, T) from `turn_batches.token_logprobs` (0 off completion
    tokens), `coefficients` (B,) the advantage of the episode each turn belongs to; divided by the iteration's number
    of `episodes`. Per token: - advantage * log pi."""
    return -(coefficients[:, None].to(logprobs.dtype) * logprobs).sum() / episodes


def reinforce_kl_loss(
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    coefficients: torch.Tensor,
    kl_beta: float,
    episodes: int,
) -> torch.Tensor:
    """Nash-MD's summed loss of a batch of turns: `reinforce_loss` plus the KL penalty, with `reference_logprobs`
    (B, T) like `logprobs` but without gradient. Per token: kl_beta * sg(log pi - log pi_ref) * log pi - advantage *
    log pi."""
    log_ratio = (logprobs.detach() - reference_logprobs).detach()
    return (kl_beta * log_ratio * logprobs).sum() / episodes + reinforce_loss(logprobs, coefficients, episodes)
