"""The simulated annotators of bench/annotate_load.py: each (a thread) logs in through the login form, opens the
compare page, and repeatedly thinks for a while and sends the real submit-and-next POST (htmx headers, the page's
CSRF token and client token), reading the next item out of the answer and timing each submit."""

from __future__ import annotations

import http.client
import random
import re
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

from annotate_load_database import PASSWORD

FORM_ACTION = re.compile(r'<form id="compare-form" method="post" action="([^"]+)"')
CLIENT_TOKEN = re.compile(r'name="client_token" value="([0-9a-f-]+)"')
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class Submit:
    finished: float
    seconds: float
    status: int


@dataclass
class Annotator:
    username: str
    port: int
    project_pk: int
    think: float
    stop: threading.Event
    submits: list[Submit] = field(default_factory=list)
    cookies: dict[str, str] = field(default_factory=dict)
    error: str = ""
    queue_empty: bool = False

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items()), **(headers or {})}
        data = None
        if body is not None:
            data = urlencode(body)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        for attempt in range(2):  # a keep-alive connection the server closed is reopened once
            try:
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                text = response.read().decode()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if attempt:
                    raise
        for name, value in response.getheaders():
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                self.cookies[key] = rest.split(";", 1)[0]
        return response.status, text, response

    def run(self) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            self.log_in()
            status, page, _ = self.request("GET", f"/projects/{self.project_pk}/compare/")
            rng = random.Random(self.username)
            while not self.stop.is_set():
                action, token = FORM_ACTION.search(page), CLIENT_TOKEN.search(page)
                if action is None:
                    self.queue_empty = "Nothing left to compare" in page
                    if not self.queue_empty:
                        self.error = f"no form in the answer ({status}): {page[:200]!r}"
                    return
                time.sleep(self.think * rng.uniform(0.5, 1.5))
                body = {"choice": rng.choice(["left", "right", "tie", "both_bad"]), "strength": rng.choice("123"),
                        "rationale": "", "client_token": token.group(1)}  # fmt: skip
                headers = {"HX-Request": "true", "HX-Target": "workspace", "X-CSRFToken": self.cookies["csrftoken"]}
                started = time.perf_counter()
                status, page, _ = self.request("POST", action.group(1), body, headers)
                self.submits.append(Submit(time.perf_counter(), time.perf_counter() - started, status))
                if status not in (200, 409):
                    self.error = f"submit answered {status}: {page[:200]!r}"
                    return
        except Exception as exc:  # noqa: BLE001 - a benchmark thread reports whatever stopped it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.conn.close()

    def log_in(self) -> None:
        _, page, _ = self.request("GET", "/accounts/login/")
        form = {
            "username": self.username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": CSRF_FIELD.search(page).group(1),
        }
        status, _, response = self.request("POST", "/accounts/login/", form)
        if status != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(f"login of {self.username} failed with {status}")
