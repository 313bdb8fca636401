"""A policy from the spec a policy version stores: the one place that knows every kind of policy."""

from __future__ import annotations

from typing import Any

from reward_models.policy.base import Policy
from reward_models.policy.endpoint import OpenAIEndpointPolicy
from reward_models.policy.local import LocalCausalLMPolicy


def load_policy(spec: dict[str, Any]) -> Policy:
    """A policy from a JSON-safe spec, as a PolicyVersion stores it.

    ``{"kind": "local", "path": ..., "device": "cpu", "dtype": "float32"}`` loads a Hugging Face causal-LM directory;
    ``{"kind": "endpoint", "base_url": ..., "model": ..., "api_key": None, "timeout": 60}`` talks to an
    OpenAI-compatible server. Other keys are passed to the policy's constructor.
    """
    options = dict(spec)
    kind = options.pop("kind", None)
    if kind == "local":
        if "path" not in options:
            raise ValueError("policy spec of kind 'local' needs a 'path'")
        return LocalCausalLMPolicy(**options)
    if kind == "endpoint":
        missing = [key for key in ("base_url", "model") if key not in options]
        if missing:
            raise ValueError(f"policy spec of kind 'endpoint' needs {', '.join(missing)}")
        return OpenAIEndpointPolicy(**options)
    raise ValueError(f"policy spec 'kind' must be 'local' or 'endpoint', got {kind!r}")
