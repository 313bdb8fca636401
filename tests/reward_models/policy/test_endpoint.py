"""The endpoint policy against a real HTTP server on 127.0.0.1 that answers with the tiny model's own turns."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reward_models.envs import load_environment
from reward_models.policy import EndpointError, EndpointUnavailable, OpenAIEndpointPolicy, load_policy, turn_messages
from reward_models.rollout import rollout

GRIDWORLD = partial(load_environment, "reward_models.envs.gridworld.GridWorld", {})


class ChatCompletionServer(ThreadingHTTPServer):
    """Serves ``/v1/chat/completions`` from a local policy; ``fail_with`` makes it answer that status instead."""

    def __init__(self, policy) -> None:
        super().__init__(("127.0.0.1", 0), ChatCompletionHandler)
        self.policy = policy
        self.lock = threading.Lock()  # the model is not thread-safe; requests arrive from a thread pool
        self.requests: list[tuple[dict, dict]] = []
        self.fail_with: int | None = None
        self.malformed = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class ChatCompletionHandler(BaseHTTPRequestHandler):
    server: ChatCompletionServer

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((body, dict(self.headers)))
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": "not found"})
        if self.server.fail_with:
            return self._send(self.server.fail_with, {"error": {"message": "model overloaded"}})
        if self.server.malformed:
            return self._send(200, {"id": "x", "object": "chat.completion"})
        greedy = body["temperature"] == 0
        with self.server.lock:
            decision = self.server.policy.act(
                [body["messages"]], greedy=greedy, temperature=body["temperature"] or 1.0, seed=body["seed"]
            )[0]
        choice = {"index": 0, "message": {"role": "assistant", "content": decision.text}, "finish_reason": "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "(all)", "logprob": decision.logprob}]}
        self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "choices": [choice]})

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # keep test output quiet
        pass


@pytest.fixture
def server(local_policy) -> Iterator[ChatCompletionServer]:
    server = ChatCompletionServer(local_policy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def conversations(count: int) -> list[list[dict]]:
    env = GRIDWORLD()
    return [turn_messages("reach the goal G", [], env.reset(env.make_task(seed)), 0) for seed in range(count)]


def test_endpoint_decisions_match_the_model_behind_it(server, local_policy):
    policy = OpenAIEndpointPolicy(server.base_url, model="tiny", api_key="secret", history_window=0)
    batch = conversations(5)
    remote = policy.act(batch)
    local = local_policy.act(batch)
    assert [(d.message, d.text) for d in remote] == [(d.message, d.text) for d in local]
    assert [d.logprob for d in remote] == pytest.approx([d.logprob for d in local], abs=1e-4)
    body, headers = server.requests[0]
    assert body["model"] == "tiny" and body["temperature"] == 0.0 and body["messages"] in batch
    assert headers["Authorization"] == "Bearer secret"


def test_sampled_requests_carry_the_temperature_and_a_seed_per_conversation(server):
    policy = OpenAIEndpointPolicy(server.base_url, model="tiny")
    policy.act(conversations(3), greedy=False, temperature=0.7, seed=40)
    bodies = [body for body, _ in server.requests]
    assert {body["temperature"] for body in bodies} == {0.7}
    assert sorted(body["seed"] for body in bodies) == [40, 41, 42]
    assert all("Authorization" not in headers for _, headers in server.requests)


def test_rollout_runs_through_the_endpoint(server):
    policy = load_policy({"kind": "endpoint", "base_url": server.base_url, "model": "tiny", "history_window": 0})
    episodes = rollout(GRIDWORLD, [GRIDWORLD().make_task(s) for s in range(3)], policy, max_turns=4)
    assert all(1 <= e.length <= 4 for e in episodes)
    assert all(step.text.startswith("goal is") for e in episodes for step in e.steps)


def test_an_error_status_raises_endpoint_error_with_the_status(server):
    server.fail_with = 503
    policy = OpenAIEndpointPolicy(server.base_url, model="tiny")
    with pytest.raises(EndpointError, match="HTTP 503.*model overloaded"):
        policy.act(conversations(1))


def test_a_reply_that_is_not_a_chat_completion_raises_endpoint_error(server):
    server.malformed = True
    with pytest.raises(EndpointError, match="not a chat completion"):
        OpenAIEndpointPolicy(server.base_url, model="tiny").act(conversations(1))


def test_a_wrong_path_is_an_http_error(server):
    with pytest.raises(EndpointError, match="HTTP 404"):
        OpenAIEndpointPolicy(server.base_url + "/nowhere", model="tiny").act(conversations(1))


def test_an_unreachable_endpoint_is_a_connection_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port now; a ConnectionError is what Celery tasks retry on.
    policy = OpenAIEndpointPolicy(f"http://127.0.0.1:{port}/v1", model="tiny", timeout=5)
    with pytest.raises(ConnectionError):
        policy.act(conversations(1))
    with pytest.raises(EndpointUnavailable):
        policy.act(conversations(1))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"base_url": "localhost:8000"}, "base_url"), ({"timeout": 0}, "timeout"), ({"max_workers": 0}, "max_workers")],
)
def test_constructor_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        OpenAIEndpointPolicy(**{"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs})
