"""Policies: the interface, the turn format every policy and trainer shares, and the built-in tiny causal LM.

Importing this package does not import torch; ``LocalCausalLMPolicy`` and the builders import it when called.
"""

from __future__ import annotations

from reward_models.policy.base import Decision, Policy
from reward_models.policy.endpoint import EndpointError, EndpointUnavailable, OpenAIEndpointPolicy
from reward_models.policy.loading import load_policy
from reward_models.policy.local import LocalCausalLMPolicy
from reward_models.policy.turns import Turn, TurnEncoding, encode_turn, format_decision, parse_decision, turn_messages

__all__ = [
    "Decision",
    "EndpointError",
    "EndpointUnavailable",
    "LocalCausalLMPolicy",
    "OpenAIEndpointPolicy",
    "Policy",
    "Turn",
    "TurnEncoding",
    "encode_turn",
    "format_decision",
    "load_policy",
    "parse_decision",
    "turn_messages",
]
