"""The measuring instrument of bench/loop.py: each round's reward model scored, outside the loop, on one fixed
set of oracle-ordered pairs of the base policy's rollouts, overall and by pair type."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def oracle_test_pairs(policy_dir: Path, tasks: int, seed: int) -> list[tuple[Any, Any]]:
    """(better, worse) pairs of the base policy's two sampled rollouts of `tasks` training tasks no round plays,
    ordered by the oracle's graded return; equal returns are left out. The same pairs score every reward model."""
    from reward_models.policy.bootstrap import BootstrapConfig
    from reward_models.policy.local import LocalCausalLMPolicy
    from simulation.episodes import policy_episodes

    policy = LocalCausalLMPolicy(policy_dir)
    episodes = policy_episodes(
        policy, tasks, samples_per_task=2, seed=seed, start=900_000, env_config=BootstrapConfig().env_config()
    )
    pairs = []
    for a, b in zip(episodes[::2], episodes[1::2], strict=True):
        if a.score != b.score:
            pairs.append((a, b) if a.score > b.score else (b, a))
    return pairs


def oracle_accuracy(model_dir: str, pairs: list[tuple[Any, Any]]) -> dict[str, float]:
    """How often the reward model scores the oracle's better trajectory higher (its members' mean reward), over
    all the pairs and by pair type."""
    from reward_models.reward.model import load_reward_model

    model = load_reward_model(model_dir, device="cpu")
    episodes = [episode for pair in pairs for episode in pair]
    cuts = [len(e.prompt) for e in episodes]
    rewards, _ = model.score(
        [e.messages[:cut] for e, cut in zip(episodes, cuts, strict=True)],
        [e.messages[cut:] for e, cut in zip(episodes, cuts, strict=True)],
    )
    return accuracy_by_type(pairs, [rewards[2 * i] > rewards[2 * i + 1] for i in range(len(pairs))])


def accuracy_by_type(pairs: list[tuple[Any, Any]], right: list[bool]) -> dict[str, float]:
    """The share of `right` over all the (better, worse) pairs (`all`) and per `simulation.episodes.pair_type`: a
    reward model can tell success from failure and still order two failures by chance, which an overall figure
    hides."""
    from simulation.episodes import pair_type

    groups: dict[str, list[bool]] = {"all": list(right)}
    for (better, worse), hit in zip(pairs, right, strict=True):
        groups.setdefault(pair_type(better, worse), []).append(hit)
    return {name: sum(hits) / len(hits) for name, hits in groups.items() if hits}


def by_type_text(shares: dict[str, float]) -> str:
    """`one succeeded 95%, both failed 50%`: an `accuracy_by_type` without its `all`."""
    return ", ".join(f"{name.replace('_', ' ')} {share:.0%}" for name, share in shares.items())
