"""The policy interface: given a batch of conversations (``turns.turn_messages``), decide each one's next turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from reward_models.policy.turns import Message


@dataclass
class Decision:
    """One generated turn. ``logprob`` is the summed log-probability of the generated tokens under the model at
    temperature 1 (the quantity trainers recompute), or None when the policy cannot report it."""

    reasoning: str
    action: str
    text: str
    logprob: float | None = None
    # The generated token ids (the end-of-sequence token included when generation reached it), when the policy
    # runs locally: trainers score exactly these, since decoding and re-encoding the text need not give them back.
    token_ids: list[int] | None = None


@runtime_checkable
class Policy(Protocol):
    # How many previous turns the policy is shown; None shows all (see reward_models.policy.turns).
    history_window: int | None

    def act(
        self,
        conversations: Sequence[Sequence[Message]],
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Decision]:
        """One decision per conversation, in order. The same inputs and seed give the same decisions."""
        ...


def load_policy(spec: dict[str, Any]) -> Policy:
    """A policy from a JSON-safe spec, as a PolicyVersion stores it.

    ``{"kind": "local", "path": ..., "device": "cpu", "dtype": "float32"}`` loads a Hugging Face causal-LM directory;
    ``{"kind": "endpoint", "base_url": ..., "model": ..., "api_key": None, "timeout": 60}`` talks to an
    OpenAI-compatible server. Other keys are passed to the policy's constructor.
    """
    options = dict(spec)
    kind = options.pop("kind", None)
    if kind == "local":
        from reward_models.policy.local import LocalCausalLMPolicy

        if "path" not in options:
            raise ValueError("policy spec of kind 'local' needs a 'path'")
        return LocalCausalLMPolicy(**options)
    if kind == "endpoint":
        from reward_models.policy.endpoint import OpenAIEndpointPolicy

        missing = [key for key in ("base_url", "model") if key not in options]
        if missing:
            raise ValueError(f"policy spec of kind 'endpoint' needs {', '.join(missing)}")
        return OpenAIEndpointPolicy(**options)
    raise ValueError(f"policy spec 'kind' must be 'local' or 'endpoint', got {kind!r}")
