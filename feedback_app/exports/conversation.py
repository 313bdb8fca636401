"""Trajectories as chat turns, the way the policy reads and writes them, fetched in bulk for streaming exports.

A trajectory of n steps is the conversation ``reward_models.policy.turns`` defines: the system message is the task
instruction, each step a user turn (its observation) followed by an assistant turn (reasoning and action in the
policy's ``format_decision`` text). Message ``2 + 2 * i`` is the policy's decision at step ``i``.

The plain-text form of the same turns is the ``Role: content`` transcript that ``turns.render_prompt`` writes for a
model without a chat template, so a text prompt here is exactly what such a policy is prompted with. `transcript`,
`text_pair` and `text_steps` come from ``turns`` (re-exported here), so that pipelines, which never import Django, lay
out text exactly as the exports do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from json.encoder import encode_basestring as encode_string
from typing import TypeVar

from django.db import connection, connections
from django.db.models import Q, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from feedback_app.models import Step, Trajectory
from reward_models.policy.turns import (  # noqa: F401 (transcript, text_pair, text_steps are re-exported)
    Message,
    format_decision,
    text_pair,
    text_steps,
    transcript,
)

# The one JSON layout of every export: compact, UTF-8 as it is.
encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class Conversation:
    """One trajectory's chat turns, with the slices rows take of them made once: a trajectory appears in many rows
    (every pair it is part of), and slicing and encoding its turns again for each was most of an export's cost.
    `json(start, stop)` is exactly `encode_json(messages[start:stop])`, built from each message's JSON."""

    __slots__ = ("trajectory_id", "task_id", "policy_version_id", "messages", "rewards", "_message_json", "_slices")

    def __init__(
        self,
        trajectory_id: int,
        task_id: int,
        policy_version_id: int | None,
        messages: list[Message],
        rewards: list[float] | None = None,
    ):
        self.trajectory_id = trajectory_id
        self.task_id = task_id
        self.policy_version_id = policy_version_id
        self.messages = messages
        self.rewards = rewards  # the steps' environment rewards, when fetched with `rewards=True`
        self._message_json: list[str] | None = None
        self._slices: dict[tuple, list[Message] | str] = {}

    @property
    def num_steps(self) -> int:
        return (len(self.messages) - 1) // 2

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
                self._message_json = [
                    _MESSAGE_JSON_START[message["role"]] + encode_string(message["content"]) + "}"
                    for message in self.messages
                ]
            self._slices[key] = "[" + ",".join(self._message_json[start:stop]) + "]"
        return self._slices[key]

    def opens_like(self, other: Conversation) -> bool:
        """Whether both start with the same instruction and first observation."""
        return len(self.messages) > 1 and len(other.messages) > 1 and self.messages[:2] == other.messages[:2]


_MESSAGE_JSON_START = {role: f'{{"role":"{role}","content":' for role in ("system", "user", "assistant")}


def action_text(action: str, tool_calls: list | str | None) -> str:
    """The action as the policy wrote it; a step that acted only through tool calls shows them as JSON. The tool
    calls may come as stored JSON text, decoded only when they are needed."""
    if action or not tool_calls:
        return action
    if isinstance(tool_calls, str):
        tool_calls = json.loads(tool_calls)
        if not tool_calls:
            return action
    return json.dumps(tool_calls, ensure_ascii=False, sort_keys=True)


def build_messages(instruction: str, steps: Sequence[Sequence]) -> list[Message]:
    """The conversation of a trajectory from its steps in order, each ending in `(observation, reasoning, action,
    tool_calls)` (what comes before, e.g. the trajectory id of a fetched row, is ignored).

    It is `turn_messages(instruction, turns[:-1], turns[-1].observation, None)` plus the last decision, written out
    flat: an export builds a million of these, and the `Turn` objects in between were a tenth of its time."""
    messages: list[Message] = [{"role": "system", "content": instruction}]
    append = messages.append
    for *_, observation, reasoning, action, tool_calls in steps:
        if tool_calls and not action:
            action = action_text(action, tool_calls)
        append({"role": "user", "content": observation})
        append({"role": "assistant", "content": format_decision(reasoning, action)})
    return messages


def shared_steps(a: Sequence[Message], b: Sequence[Message]) -> int | None:
    """The most steps ``k`` two conversations share such that both agree through observation ``k`` and both go on
    with a decision there: their first ``2 + 2 * k`` messages can be a common prompt. None when they differ
    already at the instruction or the first observation."""
    shared = None
    step = 0
    while (
        len(a) > 2 + 2 * step
        and len(b) > 2 + 2 * step
        and a[1 + 2 * step] == b[1 + 2 * step]
        and (a[0] == b[0] if step == 0 else a[2 * step] == b[2 * step])
    ):
        shared = step
        step += 1
    return shared


def id_in(field: str, ids: list[int]) -> Q:
    """`field IN ids`. On PostgreSQL the ids travel as one array parameter: binding thousands of separate
    parameters cost more than running the query (measured: about half of each batch's fetch)."""
    if connection.vendor == "postgresql":
        return Q(**{f"{field}__in": RawSQL("SELECT unnest(%s::bigint[])", [ids])})
    return Q(**{f"{field}__in": ids})


def fetch_conversations(trajectory_ids: Iterable[int], *, rewards: bool = False) -> dict[int, Conversation]:
    """Conversations of the given trajectories in two queries (trajectories with their instruction, then steps).
    With `rewards`, each also carries its steps' environment rewards."""
    ids = list(trajectory_ids)
    if not ids:
        return {}
    heads = Trajectory.objects.filter(id_in("id", ids)).values_list(
        "id", "task_id", "policy_version_id", "task__instruction"
    )
    steps: dict[int, list[tuple]] = {trajectory_id: [] for trajectory_id in ids}
    # Tool calls as text: almost every step has an action, and decoding JSON for each one costs more than the rest.
    # `build_messages` reads the last four columns, so the reward can ride in front of them.
    columns = ("trajectory_id", "env_reward") if rewards else ("trajectory_id",)
    rows = (
        Step.objects.filter(id_in("trajectory_id", ids))
        .order_by("trajectory_id", "index")
        .annotate(tool_calls_text=Cast("tool_calls", TextField()))
        .values_list(*columns, "observation", "reasoning", "action", "tool_calls_text")
    )
    for row in rows:
        steps[row[0]].append(row)
    return {
        tid: Conversation(
            tid,
            task_id,
            version_id,
            build_messages(instruction, steps[tid]),
            [row[1] for row in steps[tid]] if rewards else None,
        )
        for tid, task_id, version_id, instruction in heads
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
