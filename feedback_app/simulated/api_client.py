"""The simulated annotators' HTTP client for Tandem's REST API: the standard library only, with retries on a busy
server."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        super().__init__(f"{method} {path} answered {status}: {body}")
        self.status = status
        self.body = body


class ApiClient:
    """A small JSON client of Tandem's REST API with a personal API token (stdlib only).

    Throttled requests (429) and those a busy database turned away (503) wait for Retry-After; connection errors
    are retried a few times. Both are safe because every label carries a client_token and leasing resumes the
    caller's current lease.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0, retries: int = 4) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries

    def url(self, path: str) -> str:
        """`path` under the base URL; an absolute URL (a page's `next` link) as it is."""
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def post(self, path: str, body: dict[str, Any] | None = None, *, ok: Sequence[int] = ()) -> tuple[int, Any]:
        """POST JSON; returns (status, body). A status >= 400 raises ApiError unless it is in `ok`."""
        return self.request("POST", path, body, ok=ok)

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, ok: Sequence[int] = ()
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url(path), data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                    return response.status, json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                try:
                    payload = json.loads(raw) if raw else None
                except ValueError:
                    payload = raw.decode(errors="replace")[:500]
                if exc.code in (429, 503) and attempt < self.retries:
                    time.sleep(float(exc.headers.get("Retry-After") or 1))
                    continue
                if exc.code in ok:
                    return exc.code, payload
                raise ApiError(method, path, exc.code, payload) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt == self.retries:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")
