"""Hand-made PPO episodes the PPO tests share: an episode from a conversation, and a three-turn gridworld episode
with its observations and turns."""

from __future__ import annotations

from reward_models.conversation import split_conversation
from reward_models.rollout import Episode, Step


def episode_of(messages: list[dict], tools: list[dict] | None = None) -> Episode:
    """An episode whose conversation is `messages` (the prompt, then each turn and what came back)."""
    prompt, turns = split_conversation(messages)
    steps = [
        Step("", turn.message, list(turn.replies), "", "", turn.message.get("content") or "", reward=0.0, done=False)
        for turn in turns
    ]
    return Episode(
        {"seed": 1, "instruction": prompt[0]["content"]}, 0, steps, "", 0.0, False, False, prompt, tools or []
    )


def grid_episode(observations: list[str], texts: list[str]) -> Episode:
    """A gridworld episode: observation i, then turn i; the last observation is where the last turn led."""
    messages = [{"role": "system", "content": "reach the goal G"}, {"role": "user", "content": observations[0]}]
    for text, observation in zip(texts, [*observations[1:], ". . | . A"], strict=True):
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
    return episode_of(messages)


EPISODE_OBSERVATIONS = [". A | G .", ". . | G A", ". . | A ."]
EPISODE_TEXTS = [
    "goal is down 1 left 1 ; action right",
    "goal is down 1 left 1 ; action left",
    "goal is down 0 left 1 ; action left",
]
EPISODE = grid_episode(EPISODE_OBSERVATIONS, EPISODE_TEXTS)
