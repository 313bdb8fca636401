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

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from json.encoder import encode_basestring as encode_string
from typing import TypeVar

from django.db import connection, connections
from django.db.models import Q, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from feedback_app.models import Step, Task, Trajectory
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
    `json(start, stop)` is exactly `encode_json(messages[start:stop])`, built from each message's JSON.

    A conversation is made from its messages or from each message's JSON (`message_json`, as PostgreSQL builds it in
    `fetch_conversations`); either is derived from the other only when asked for, so a JSONL export that splices
    the JSON never builds the messages in Python."""

    __slots__ = ("trajectory_id", "task_id", "policy_version_id", "rewards", "_messages", "_message_json", "_slices")

    def __init__(
        self,
        trajectory_id: int,
        task_id: int,
        policy_version_id: int | None,
        messages: list[Message] | None = None,
        rewards: list[float] | None = None,
        *,
        message_json: list[str] | None = None,
    ):
        if (messages is None) == (message_json is None):
            raise ValueError("a Conversation is made from its messages or from their JSON: give exactly one")
        self.trajectory_id = trajectory_id
        self.task_id = task_id
        self.policy_version_id = policy_version_id
        self.rewards = rewards  # the steps' environment rewards, when fetched with `rewards=True`
        self._messages = messages
        self._message_json = message_json
        self._slices: dict[tuple, list[Message] | str] = {}

    @property
    def messages(self) -> list[Message]:
        if self._messages is None:
            self._messages = json.loads("[" + ",".join(self._message_json) + "]")
        return self._messages

    @property
    def num_steps(self) -> int:
        return (len(self._messages if self._messages is not None else self._message_json) - 1) // 2

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
                    for message in self._messages
                ]
            self._slices[key] = "[" + ",".join(self._message_json[start:stop]) + "]"
        return self._slices[key]

    def opens_like(self, other: Conversation) -> bool:
        """Whether both start with the same instruction and first observation."""
        if self._message_json is not None and other._message_json is not None:  # one encoding: same text, same turns
            first, second = self._message_json, other._message_json
        else:
            first, second = self.messages, other.messages
        return len(first) > 1 and len(second) > 1 and first[:2] == second[:2]


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
    """Conversations of the given trajectories. With `rewards`, each also carries its steps' environment rewards.

    On PostgreSQL the database writes each message's JSON (`Conversation(message_json=...)`), in one query: that
    work then runs on the database's core, beside the export's, instead of in the export's one Python thread (it was
    a third of a preference export's CPU). A trajectory with a step that acts only through tool calls is built in
    Python, where `action_text` writes them."""
    ids = list(trajectory_ids)
    if not ids:
        return {}
    if connection.vendor != "postgresql":
        return _built_conversations(ids, rewards)
    conversations: dict[int, Conversation] = {}
    tool_only: list[int] = []
    with connection.cursor() as cursor:
        cursor.execute(_encoded_sql(rewards), {"ids": ids, "space": PYTHON_WHITESPACE})
        for trajectory_id, task_id, version_id, messages, step_rewards, needs_python in cursor.fetchall():
            if needs_python:
                tool_only.append(trajectory_id)
                continue
            conversations[trajectory_id] = Conversation(
                trajectory_id,
                task_id,
                version_id,
                rewards=(step_rewards or []) if rewards else None,
                message_json=messages.split(MESSAGE_SEPARATOR),
            )
    if tool_only:
        conversations.update(_built_conversations(tool_only, rewards))
    return conversations


# Every character `str.strip()` removes (`str.isspace()`; a test checks the list against this Python's Unicode
# tables): `format_decision` strips the reasoning, and the SQL must strip the same.
PYTHON_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


# Between the messages' JSON in the one text the query returns per trajectory: JSON escapes every control
# character inside its strings, so this one never occurs in a message. (An array of texts came back escaped a second
# time, and taking it apart cost the export's Python process more than the JSON saved.)
MESSAGE_SEPARATOR = "\x1e"


@functools.cache
def _encoded_sql(rewards: bool) -> str:
    """Per trajectory: id, task, policy version, the JSON of each message as `Conversation.json` writes it, joined
    by MESSAGE_SEPARATOR (PostgreSQL's `to_json` of a text escapes exactly what Python's `encode_basestring` escapes;
    a test holds both to it), the steps' rewards (NULL unless `rewards`), and whether a step acts only through tool
    calls. The assistant turn is `format_decision`'s text."""
    quote = connection.ops.quote_name
    trajectory, task, step = (quote(model._meta.db_table) for model in (Trajectory, Task, Step))

    def message(role: str, content: str) -> str:
        return f"""'{{"role":"{role}","content":' || to_json({content})::text || '}}'"""

    reasoning = "btrim(s.reasoning, %(space)s)"
    decision = (
        f"CASE WHEN {reasoning} = '' THEN 'action ' || s.action ELSE {reasoning} || ' ; action ' || s.action END"
    )
    step_rewards = "array_agg(s.env_reward ORDER BY s.index) FILTER (WHERE p.half = 0)" if rewards else "NULL"
    return f"""
        SELECT t.id, t.task_id, t.policy_version_id,
               concat_ws(chr({ord(MESSAGE_SEPARATOR)}), {message("system", "k.instruction")}, m.messages),
               m.rewards, coalesce(m.tool_only, false)
        FROM {trajectory} t
        JOIN {task} k ON k.id = t.task_id
        LEFT JOIN LATERAL (
            SELECT string_agg(p.part, chr({ord(MESSAGE_SEPARATOR)}) ORDER BY s.index, p.half) AS messages,
                   {step_rewards} AS rewards,
                   bool_or(s.action = '' AND s.tool_calls <> '[]'::jsonb) AS tool_only
            FROM {step} s
            CROSS JOIN LATERAL (
                VALUES (0, {message("user", "s.observation")}), (1, {message("assistant", decision)})
            ) p(half, part)
            WHERE s.trajectory_id = t.id
        ) m ON true
        WHERE t.id = ANY(%(ids)s::bigint[])
    """


def _built_conversations(ids: list[int], rewards: bool) -> dict[int, Conversation]:
    """Conversations built in Python from the trajectories' steps, in two queries (trajectories with their
    instruction, then steps)."""
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
