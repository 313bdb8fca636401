"""Each online method moves the policy the way its judge points: PPO, Nash-MD, SPO, GRPO and RLOO, trained against a
judge that wants the first move to be "up", make "up" more likely.

The judges are stand-ins loaded where the real ones would be (a reward model that scores 1 for a first move up and 0
otherwise; a preference model that prefers the episode that moves up), so each method's own path from the judge's
verdict to its update (rewards, advantages, win rates, the loss's sign) is what the test checks: a reversed sign
anywhere on it lowers the share of "up" instead. Episodes are one turn long, and the share of "up" is counted over
sampled first moves of the same training tasks before and after. Each method runs at a learning rate at which six to
eight updates move the share clearly (PPO's clipped steps take a larger one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from reward_models.common.artifacts import ARTIFACT_MANIFEST
from reward_models.envs.gridworld import GridWorld
from reward_models.policy.local import LocalCausalLMPolicy
from reward_models.policy.turns import parse_decision
from reward_models.rollout import rollout

TASKS = range(1000, 1024)  # training seeds, far from the held-out ones
SAMPLES = 4


def first_move(conversation: Sequence[dict]) -> str:
    """The move of the first assistant turn of a conversation (its text, as the policy wrote it)."""
    for message in conversation:
        if message.get("role") == "assistant":
            return parse_decision(message.get("content") or "")[1]
    return ""


def wanted(conversation: Sequence[dict]) -> float:
    return 1.0 if first_move(conversation) == "up" else 0.0


class UpRewardModel:
    """A reward model's interface: 1 for a completion whose first move is up, else 0."""

    def score(self, prompts, completions, tools=()):
        return [wanted(completion) for completion in completions], None


class UpPreferenceModel:
    """A preference model's interface: the completion that moves up first wins; equals tie."""

    def probability(self, pairs, tools=()):
        return [0.5 + (wanted(ours) - wanted(theirs)) / 2 for _, ours, theirs in pairs]

    def win_matrix(self, prompt, completions, tools=None):
        return [[0.5 + (wanted(a) - wanted(b)) / 2 for b in completions] for a in completions]


@pytest.fixture
def judge_dir(tmp_path) -> Path:
    """A directory the configs can name as the judge: the stand-in is what loads from it."""
    folder = tmp_path / "judge"
    folder.mkdir()
    (folder / ARTIFACT_MANIFEST).write_text(json.dumps({"summary": {"labels_used": 1, "train_samples": 1}}))
    return folder


@pytest.fixture
def stand_in_judges(monkeypatch):
    from reward_models.finetune import preference_scoring
    from reward_models.reward import model as reward_model

    monkeypatch.setattr(reward_model, "load_reward_model", lambda *args, **kwargs: UpRewardModel())
    monkeypatch.setattr(preference_scoring, "load_preference_model", lambda *args, **kwargs: UpPreferenceModel())


def up_share(policy_dir: Path) -> float:
    """The share of "up" among sampled first moves on the training tasks."""
    env = GridWorld()
    policy = LocalCausalLMPolicy(policy_dir)
    episodes = rollout(
        GridWorld,
        [env.make_task(seed) for seed in TASKS],
        policy,
        samples_per_task=SAMPLES,
        greedy=False,
        seed=1,
        render=False,
        max_turns=1,
    )
    return sum(episode.steps[0].action == "up" for episode in episodes) / len(episodes)


def train(method: str, policy_dir: Path, judge_dir: Path, output_dir: Path) -> dict:
    """A short run of `method` against the judge in `judge_dir`, without held-out evaluation or a KL penalty."""
    from reward_models.finetune import grpo, nash, ppo, ppo_config

    common = {"policy_path": str(policy_dir), "output_dir": str(output_dir), "kl_beta": 0.0, "eval_tasks": 0}
    common["save_steps"] = 1000
    if method == "ppo":
        config = ppo_config.PPOConfig(
            **common,
            reward_source="model",
            reward_model_path=str(judge_dir),
            normalize_reward=False,
            invalid_penalty=0.0,
            selection_tasks=0,
            max_turns=1,
            max_steps=6,
            rollouts_per_step=24,
            batch_size=24,
            learning_rate=3e-3,
        )
        return ppo.main(config)
    if method in ("nash_md", "spo"):
        samples = {"samples_per_task": 4} if method == "spo" else {}
        config = nash.NashConfig(
            **common,
            **samples,
            preference_model_path=str(judge_dir),
            method=method,
            max_turns=1,
            max_steps=6,
            batch_size=8,
            learning_rate=3e-4,
        )
        return nash.main(config)
    config = grpo.GRPOConfig(
        **common,
        reward_model_path=str(judge_dir),
        algorithm=method,
        max_steps=8,
        prompts_per_step=4,
        num_generations=4,
        train_prompts=16,
        learning_rate=3e-4,
    )
    return grpo.main(config)


@pytest.mark.parametrize("method", ["ppo", "nash_md", "spo", "grpo", "rloo"])
def test_the_policy_moves_towards_what_its_judge_prefers(method, policy_dir, judge_dir, stand_in_judges, tmp_path):
    before = up_share(policy_dir)
    train(method, policy_dir, judge_dir, tmp_path / "run")
    after = up_share(tmp_path / "run")
    assert after > before + 0.15, f'the share of first moves "up" went from {before:.2f} to {after:.2f}'
