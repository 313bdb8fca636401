"""The `act` the package's own policies share (`ConversationPolicy`): what reaches a policy's `_decide`."""

from __future__ import annotations

import pytest

from reward_models.policy import OpenAIEndpointPolicy, Policy
from reward_models.policy.base import BatchedPolicy, ConversationPolicy, Decision, text_decision

CONVERSATIONS = [[{"role": "user", "content": "A . G"}], [{"role": "user", "content": "G . A"}]]
SHOP_TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


class RecordingPolicy(ConversationPolicy):
    history_window = None

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def _decide(self, conversations, tools, greedy, temperature, seed) -> list[Decision]:
        self.calls.append((conversations, tools, greedy, temperature, seed))
        return [text_decision(f"turn {index}") for index in range(len(conversations))]


def test_act_gives_every_conversation_no_tools_when_none_are_offered():
    policy = RecordingPolicy()
    decisions = policy.act(CONVERSATIONS)
    assert [decision.text for decision in decisions] == ["turn 0", "turn 1"]
    assert policy.calls == [(CONVERSATIONS, [None, None], True, 1.0, 0)]


def test_act_passes_the_tools_and_the_sampling_settings_on():
    policy = RecordingPolicy()
    policy.act(CONVERSATIONS, tools=(SHOP_TOOLS, None), greedy=False, temperature=0.7, seed=5)
    assert policy.calls == [(CONVERSATIONS, [SHOP_TOOLS, None], False, 0.7, 5)]


def test_the_package_policies_share_act_and_meet_the_policy_interface():
    assert issubclass(BatchedPolicy, ConversationPolicy) and issubclass(OpenAIEndpointPolicy, ConversationPolicy)
    assert OpenAIEndpointPolicy.act is ConversationPolicy.act is BatchedPolicy.act
    assert isinstance(RecordingPolicy(), Policy)
    with pytest.raises(NotImplementedError):
        ConversationPolicy().act(CONVERSATIONS)
