"""A policy served by an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, TGI, llama.cpp, a hosted API).

Uses only the standard library (urllib), so it adds no dependency. Failures are split the way Celery tasks retry:
an unreachable server or a timeout raises ``EndpointUnavailable`` (a ``ConnectionError``, so
``autoretry_for=(ConnectionError,)`` retries it), an HTTP error status or a malformed reply raises ``EndpointError``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reward_models.policy.base import Conversation, ConversationPolicy, Decision, Tools


class EndpointError(RuntimeError):
    """The endpoint answered, but with an error status or a reply that is not a chat completion."""


class EndpointUnavailable(ConnectionError):
    """The endpoint could not be reached or did not answer in time."""


class OpenAIEndpointPolicy(ConversationPolicy):
    """Each conversation is one ``POST {base_url}/chat/completions``; a batch runs ``max_workers`` at a time. The
    task's tools go with each request, and the assistant message comes back as the server sent it, its
    ``tool_calls`` included.

    Greedy decoding is sent as ``temperature: 0``; every request carries a ``seed`` (the batch seed plus the
    conversation's index), which servers that support it use for reproducible sampling. The logprob is the sum of the
    returned token logprobs when the server sends them, else None.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        history_window: int | None = None,
        max_tokens: int = 256,
        max_workers: int = 8,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.history_window = history_window
        self.max_tokens = max_tokens
        self.max_workers = max_workers

    def _decide(
        self, conversations: Sequence[Conversation], tools: list[Tools], greedy: bool, temperature: float, seed: int
    ) -> list[Decision]:
        requests = []
        for index, (conversation, offered) in enumerate(zip(conversations, tools, strict=True)):
            request = {
                "model": self.model,
                "messages": list(conversation),
                "temperature": 0.0 if greedy else temperature,
                "max_tokens": self.max_tokens,
                "seed": seed + index,
                "logprobs": True,
            }
            if offered:
                request["tools"] = list(offered)
            requests.append(request)
        if len(requests) <= 1:
            return [self._complete(request) for request in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(requests))) as pool:
            return list(pool.map(self._complete, requests))

    def _complete(self, payload: dict[str, Any]) -> Decision:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(payload).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise EndpointError(f"{self.url} answered HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError) as exc:
            raise EndpointUnavailable(f"{self.url} is unreachable: {exc}") from exc
        try:
            reply = json.loads(body)
            choice = reply["choices"][0]
            sent = choice["message"]
            text = sent.get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise EndpointError(f"{self.url} sent a reply that is not a chat completion: {body[:500]!r}") from exc
        # The message as the server sent it, tool calls included; only the role is fixed.
        message = {**{key: value for key, value in sent.items() if value is not None}, "role": "assistant"}
        message.setdefault("content", text)
        return Decision(text=text, message=message, logprob=_summed_logprob(choice))


def _summed_logprob(choice: dict[str, Any]) -> float | None:
    # OpenAI's format: {"logprobs": {"content": [{"token": ..., "logprob": ...}, ...]}}; servers may omit it.
    tokens = (choice.get("logprobs") or {}).get("content")
    if not tokens:
        return None
    return float(sum(token["logprob"] for token in tokens))
