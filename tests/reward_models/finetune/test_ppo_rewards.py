"""PPO's reward and advantage pieces: GAE, what a reward model and the critic read of an episode, the charge for
invalid turns, the critic's bootstrap after a cut episode and the running moments that normalise rewards."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from reward_models.finetune.ppo_rewards import (
    RunningMoments,
    charge_invalid_turns,
    critic_texts,
    episode_values,
    gae,
    load_critic,
    reward_model_inputs,
)
from reward_models.policy.turns import elide_observations, render_prompt, transcript
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows
from tests.reward_models.finetune.ppo_episodes import (
    EPISODE,
    EPISODE_OBSERVATIONS,
    EPISODE_TEXTS,
    episode_of,
    grid_episode,
)

# A 4x4 grid with a 6-step limit keeps episodes short.
SMALL_GRID = {"size": 4, "max_steps": 6}


def test_gae_matches_a_hand_computed_example():
    # gamma 0.9, lambda 0.8; V = (0.5, 0.4, 0.2), rewards (0, 0, 1), the episode ends after the last turn.
    # delta_2 = 1 - 0.2 = 0.8;  delta_1 = 0 + 0.9 * 0.2 - 0.4 = -0.22;  delta_0 = 0 + 0.9 * 0.4 - 0.5 = -0.14
    # A_2 = 0.8;  A_1 = -0.22 + 0.72 * 0.8 = 0.356;  A_0 = -0.14 + 0.72 * 0.356 = 0.11632
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.4, 0.2], gamma=0.9, lam=0.8)
    assert advantages == pytest.approx([0.11632, 0.356, 0.8])
    assert returns == pytest.approx([0.61632, 0.756, 1.0])


def test_gae_with_lambda_one_gives_the_discounted_return_and_bootstraps_a_truncated_episode():
    rewards, values = [1.0, 0.0, 2.0], [0.3, -0.2, 0.7]
    _, returns = gae(rewards, values, gamma=0.5, lam=1.0)
    assert returns == pytest.approx([1.0 + 0.25 * 2.0, 0.5 * 2.0, 2.0])
    advantages, _ = gae([0.0], [0.25], gamma=0.5, lam=0.9, last_value=1.0)
    assert advantages == pytest.approx([0.5 * 1.0 - 0.25])


def test_gae_refuses_rewards_and_values_of_different_lengths():
    with pytest.raises(ValueError, match="2 rewards but 1 values"):
        gae([0.0, 1.0], [0.0], gamma=1.0, lam=1.0)


def test_the_reward_model_reads_an_episode_as_the_preference_export_lays_it_out():
    first, second = scripted_episodes(1, per_task=2, noises=(0.0, 1.0), seed=3, env_config=SMALL_GRID)
    row = preference_rows([first, second], ties="include")[0]
    chosen = first if row["chosen_trajectory_id"] == first.trajectory_id else second
    replayed = episode_of(chosen.messages)
    assert reward_model_inputs(replayed, "full") == (row["prompt"], row["chosen"])
    prompt, completion = reward_model_inputs(replayed, "decisions")
    assert [*prompt, *completion] == elide_observations(chosen.messages)
    assert completion[-1]["content"] == chosen.messages[-1]["content"]
    prompt, completion = reward_model_inputs(replayed, "actions")
    assert [m["content"] for m in completion[1::2]] == [m["content"] for m in chosen.messages[3::2]]
    assert [m["content"] for m in completion[::2]] == [f"action {a}" for a in chosen.actions]


def test_the_reasoning_cannot_reach_a_reward_model_reading_actions():
    """Two episodes that differ only in their reasoning read the same to an ``actions`` reward model."""
    honest = grid_episode(EPISODE_OBSERVATIONS, EPISODE_TEXTS)
    boastful = grid_episode(EPISODE_OBSERVATIONS, [f"goal is down 0 {t}" for t in EPISODE_TEXTS])
    assert reward_model_inputs(honest, "decisions") != reward_model_inputs(boastful, "decisions")
    assert reward_model_inputs(honest, "actions") == reward_model_inputs(boastful, "actions")
    assert reward_model_inputs(honest, "moves")[1][0] == {"role": "assistant", "content": "action right"}


def test_invalid_turns_are_charged_and_counted_and_valid_ones_left_alone():
    episode = grid_episode(EPISODE_OBSERVATIONS, EPISODE_TEXTS)
    episode.steps[1].info["invalid"] = True
    episode.steps[2].info["invalid"] = False
    rewards = [[0.0, 0.0, 1.0]]
    assert charge_invalid_turns(rewards, [episode], 0.25) == 1
    assert rewards == [[0.0, -0.25, 1.0]]


def test_the_critic_reads_each_step_before_its_decision(tiny_policy_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir)
    conversation = EPISODE.conversation()
    prompt, pieces = critic_texts(tokenizer, conversation, None, "text")
    for step in range(len(pieces)):
        upto = prompt + "".join(pieces[: step + 1])
        assert upto == transcript(conversation.before_step(step)) + "\nAssistant:"
        assert upto.endswith(f"User: {EPISODE_OBSERVATIONS[step]}\nAssistant:")
    # Through the chat template: up to the end of the prompt the policy was given for each turn.
    prompt, pieces = critic_texts(tokenizer, conversation, None, "conversational")
    for step in range(len(pieces)):
        upto = prompt + "".join(pieces[: step + 1])
        assert upto == render_prompt(tokenizer, conversation.before_step(step))
        assert upto.endswith(f"<user> {EPISODE_OBSERVATIONS[step]} <assistant>")


@pytest.mark.parametrize("style", ["text", "conversational"])
def test_an_episode_cut_by_the_turn_cap_bootstraps_from_the_critics_value_after_its_last_turn(tiny_policy_dir, style):
    torch.manual_seed(0)  # the value head's initial weights: whatever ran before in this process must not decide them
    critic, tokenizer = load_critic(str(tiny_policy_dir), 256, "policy_path")
    critic.config.step_style = style
    critic.eval()
    ended = dataclasses.replace(EPISODE, truncated=False)
    cut = dataclasses.replace(EPISODE, steps=EPISODE.steps[:2], truncated=True)
    values, last_values, windows = episode_values(critic, tokenizer, [ended, cut], batch_size=4)
    # The state after the cut episode's last turn is the one before the ended episode's third decision.
    assert last_values[1] == pytest.approx(values[0][2], abs=1e-5) and abs(last_values[1]) > 1e-3
    assert values[1] == pytest.approx(values[0][:2], abs=1e-5)
    assert last_values[0] == 0.0
    # The critic trains on the turns only: the state after the last one has no return to fit.
    assert sorted((w.episode, step) for w in windows for step in w.steps) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    advantages, returns = gae([0.0, 1.0], values[1], gamma=0.9, lam=0.95, last_value=last_values[1])
    assert returns[1] == pytest.approx(1.0 + 0.9 * values[0][2])


def test_running_moments_match_the_statistics_of_everything_seen():
    moments = RunningMoments()
    values = [0.5, -1.0, 2.0, 3.5, 0.0, 1.25, -2.5]
    moments.update(values[:3])
    moments.update(values[3:])
    mean = sum(values) / len(values)
    assert moments.mean == pytest.approx(mean)
    assert moments.std == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)))
    assert moments.normalise(mean) == pytest.approx(0.0)
