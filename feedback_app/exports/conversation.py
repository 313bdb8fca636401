"""Trajectories as chat messages, fetched in bulk for streaming exports.

A trajectory's messages are what `reward_models.conversation` builds from its stored turns: the prompt (the
messages before the agent's first turn), then each step's assistant message and the replies that came back, all
verbatim. Every export row takes its prompts, completions and pieces from these messages, and nothing else.

The rows are cut from these messages by the row contract (`reward_models.rows`), which pipelines and simulated data
use too: their plain-text form is the ``Role: content`` transcript that ``turns.render_prompt`` writes for a model
without a chat template, so a text prompt is exactly what such a policy is prompted with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from django.db import connection, connections
from django.db.models import Q
from django.db.models.expressions import RawSQL

from feedback_app.models import Step, Trajectory
from reward_models.conversation import StepTurn, build_conversation
from reward_models.policy.turns import Message

# The one JSON layout of every export: compact, UTF-8 as it is.
encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class Conversation:
    """One trajectory's messages, with where each step's assistant message sits, and the slices rows take of them
    made once: a trajectory appears in many rows (every pair it is part of), and slicing and encoding its messages
    again for each was most of an export's cost. `json(start, stop)` is exactly `encode_json(messages[start:stop])`,
    built from each message's JSON."""

    __slots__ = (
        "trajectory_id",
        "task_id",
        "policy_version_id",
        "tools",
        "rewards",
        "messages",
        "prompt_length",
        "step_starts",
        "_message_json",
        "_slices",
    )

    def __init__(
        self,
        trajectory_id: int,
        task_id: int,
        policy_version_id: int | None,
        prompt: list[Message],
        steps: Iterable[StepTurn],
        *,
        tools: list | None = None,
        rewards: list[float] | None = None,
    ):
        built = build_conversation(prompt, steps)
        self.trajectory_id = trajectory_id
        self.task_id = task_id
        self.policy_version_id = policy_version_id
        self.tools = tools or []
        self.rewards = rewards  # the steps' environment rewards, when fetched with `rewards=True`
        self.messages = built.messages
        self.prompt_length = built.prompt_length
        self.step_starts = built.step_starts
        self._message_json: list[str] | None = None
        self._slices: dict[tuple, list[Message] | str] = {}

    @property
    def num_steps(self) -> int:
        return len(self.step_starts)

    def before_step(self, step: int) -> int:
        """The position of step `step`'s assistant message: the messages before it are what the agent acted on."""
        return self.step_starts[step]

    def turns(self, start: int, stop: int | None = None) -> list[Message]:
        """`messages[start:stop]`, the same list object each time (callers must not change it)."""
        key = (start, stop)
        if key not in self._slices:
            self._slices[key] = self.messages[start:stop]
        return self._slices[key]

    def json(self, start: int, stop: int | None = None) -> str:
        key = ("json", start, stop)
        if key not in self._slices:
            if self._message_json is None:
                self._message_json = [encode_json(message) for message in self.messages]
            self._slices[key] = "[" + ",".join(self._message_json[start:stop]) + "]"
        return self._slices[key]

    def shared_prompt(self, other: Conversation) -> int:
        """How many leading prompt messages both trajectories share (all of them, for two runs of one task)."""
        limit = min(self.prompt_length, other.prompt_length)
        shared = 0
        while shared < limit and self.messages[shared] == other.messages[shared]:
            shared += 1
        return shared


def id_in(field: str, ids: list[int]) -> Q:
    """`field IN ids`. On PostgreSQL the ids travel as one array parameter: binding thousands of separate
    parameters cost more than running the query (measured: about half of each batch's fetch)."""
    if connection.vendor == "postgresql":
        return Q(**{f"{field}__in": RawSQL("SELECT unnest(%s::bigint[])", [ids])})
    return Q(**{f"{field}__in": ids})


def fetch_conversations(trajectory_ids: Iterable[int], *, rewards: bool = False) -> dict[int, Conversation]:
    """Conversations of the given trajectories, in two queries (the trajectories' prompts and tools, then their
    steps' messages and replies). With `rewards`, each also carries its steps' environment rewards."""
    ids = list(trajectory_ids)
    if not ids:
        return {}
    heads = Trajectory.objects.filter(id_in("id", ids)).values_list(
        "id", "task_id", "policy_version_id", "prompt", "tools"
    )
    steps: dict[int, list[tuple]] = {trajectory_id: [] for trajectory_id in ids}
    rows = (
        Step.objects.filter(id_in("trajectory_id", ids))
        .order_by("trajectory_id", "index")
        .values_list("trajectory_id", "message", "replies", "env_reward")
    )
    for row in rows:
        steps[row[0]].append(row)
    return {
        tid: Conversation(
            tid,
            task_id,
            version_id,
            prompt,
            (StepTurn(message, replies) for _, message, replies, _ in steps[tid]),
            tools=tools,
            rewards=[row[3] for row in steps[tid]] if rewards else None,
        )
        for tid, task_id, version_id, prompt, tools in heads
    }


Batch = TypeVar("Batch")


def with_conversations(
    batches: Iterable[Batch],
    trajectory_ids: Callable[[Batch], Iterable[int]],
    fetch: Callable[[list[int]], dict[int, Conversation]] | None = None,
) -> Iterator[tuple[Batch, dict[int, Conversation]]]:
    """Each batch with the conversations of the trajectories it names (fetched by `fetch`, by default
    `fetch_conversations`), holding at most two batches' worth.

    The next batch's conversations are fetched while the caller works through the current one, on a second database
    connection in a background thread, so the database's time overlaps ours (about a third of an export's time
    otherwise). Inside a transaction (tests, or a caller's atomic block) another connection could not see its
    uncommitted rows, so there the fetch runs in line. A trajectory that consecutive batches share is fetched once.
    """
    fetch = fetch or fetch_conversations
    pool = None if connection.in_atomic_block else ThreadPoolExecutor(1, thread_name_prefix="export-fetch")

    def start(wanted: set[int], known: dict[int, Conversation]) -> tuple[dict[int, Conversation], Future | dict]:
        reused = {tid: known[tid] for tid in wanted if tid in known}
        missing = list(wanted - reused.keys())
        return reused, (pool.submit(fetch, missing) if pool else fetch(missing))

    batches = iter(batches)
    try:
        current = next(batches, None)
        pending = start(set(trajectory_ids(current)), {}) if current is not None else None
        while current is not None:
            reused, fetched = pending
            conversations = {**reused, **(fetched.result() if isinstance(fetched, Future) else fetched)}
            following = next(batches, None)
            if following is not None:
                pending = start(set(trajectory_ids(following)), conversations)
            yield current, conversations
            current = following
    finally:
        if pool is not None:
            # The worker thread's connection is its own: close it there, after any fetch still running.
            pool.submit(connections.close_all).result()
            pool.shutdown()
