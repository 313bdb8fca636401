"""Loaded policies are cached per worker process, so a rollout worker does not reload weights for every batch."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from django.conf import settings

from feedback_app.models import PolicyVersion
from reward_models.policy import Policy, load_policy

_cache: OrderedDict[str, Policy] = OrderedDict()
_lock = threading.Lock()


def policy_for(version: PolicyVersion) -> Policy:
    """The runnable policy of `version`; the least recently used one is dropped past TANDEM_POLICY_CACHE_SIZE."""
    spec = version.policy_spec()
    if spec["kind"] == "local":
        spec["device"] = _device()
    key = json.dumps(spec, sort_keys=True)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    policy = load_policy(spec)
    with _lock:
        _cache[key] = policy
        while len(_cache) > settings.TANDEM_POLICY_CACHE_SIZE:
            _cache.popitem(last=False)
    return policy


def _device() -> str:
    if settings.TANDEM_POLICY_DEVICE != "auto":
        return settings.TANDEM_POLICY_DEVICE
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
