"""DPO's preference pairs: which exported rows are conversational pairs, the pairs encoded turn by turn, what action
each side took, and the per-action balancing that keeps DPO from learning an action to be good, or bad, everywhere.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reward_models.common.data import bad_rows, row_tools, rows_error
from reward_models.conversation import Message, message_tool_calls
from reward_models.envs.base import Environment, message_action
from reward_models.finetune.turn_batches import is_messages, prompt_steps, row_conversation
from reward_models.policy.turns import TurnEncoding, encode_conversation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class PreferencePair:
    """One row as turns: the chosen and the rejected side's turns after the shared prefix, each as the policy saw
    and wrote it. At the step level each side holds one turn. The actions (`action_key`) are what balancing counts."""

    chosen: list[TurnEncoding]
    rejected: list[TurnEncoding]
    chosen_action: str
    rejected_action: str


def action_key(env: Environment, message: Message) -> str:
    """What a turn did, as text, for balancing: its tool calls (names and arguments, whatever the reasoning around
    them and whatever their ids) where it makes any, else what the environment plays for it (the gridworld's move;
    an environment that reads messages no other way plays their text)."""
    calls = message_tool_calls(message)
    if calls:
        return json.dumps([_call_key(call) for call in calls], sort_keys=True, ensure_ascii=False)
    action = message_action(env, message)
    return action.strip() if isinstance(action, str) else json.dumps(action, sort_keys=True, default=str)


def _call_key(call: dict[str, Any]) -> list[Any]:
    function = call.get("function", call)
    arguments = function.get("arguments", "")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return [function.get("name", ""), arguments]


def pair_row_problem(row: dict[str, Any], level: str) -> str | None:
    if row.get("tie"):
        return None
    for key in ("prompt", "chosen", "rejected"):
        value = row.get(key)
        if not value or not is_messages(value):
            return f"{key!r} must be a non-empty list of messages (export the conversational style)"
    if row["prompt"][-1].get("role") not in ("user", "tool"):
        return (
            "the prompt must end with an observation (a user or tool message); a trajectory-level pair needs both "
            "sides to start from the same first observation"
        )
    for key in ("chosen", "rejected"):
        if row[key][0].get("role") != "assistant":
            return f"{key!r} must start with an assistant message"
    try:
        for side in trained_sides(row, level):
            row_conversation(row["prompt"] + side)
    except ValueError as exc:
        return str(exc)
    return None


def trained_sides(row: dict[str, Any], level: str) -> tuple[list[Message], list[Message]]:
    """The chosen and the rejected side as trained at `level`: at the step level only the step where they part."""
    if level == "step":
        return row["chosen"][:1], row["rejected"][:1]
    return list(row["chosen"]), list(row["rejected"])


def preference_pairs(
    rows: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    history_window: int | None,
    level: str,
    env: Environment,
) -> list[PreferencePair]:
    """The rows' pairs, encoded turn by turn with each row's tools; `env` reads the actions. Ties (``tie: true``)
    are no preference and are left out; rows that are not conversational pairs are a `ConfigError` on
    ``data_path`` naming every one of them (`row_problems`)."""
    if problems := bad_rows(rows, lambda row: pair_row_problem(row, level)):
        raise rows_error(problems, len(rows))
    pairs = []
    for row in rows:
        if row.get("tie"):
            continue
        prompt, (chosen, rejected) = list(row["prompt"]), trained_sides(row, level)
        start, tools = prompt_steps(prompt), row_tools(row)
        encoded = [
            encode_conversation(tokenizer, row_conversation(prompt + side), tools, history_window, start)
            for side in (chosen, rejected)
        ]
        pairs.append(
            PreferencePair(
                chosen=encoded[0],
                rejected=encoded[1],
                chosen_action=action_key(env, chosen[0]),
                rejected_action=action_key(env, rejected[0]),
            )
        )
    return pairs


def balance_by_action(pairs: Sequence[PreferencePair], seed: int) -> list[PreferencePair]:
    """A subset of `pairs` in which every action seen more than once is chosen exactly as often as it is rejected,
    so that DPO learns no action to be good, or bad, everywhere.

    Pairs are edges chosen -> rejected between actions, and a balanced subset is a circulation: a union of cycles
    (a -> a, a -> b -> a, a -> b -> c -> a, ...). An action that occurs once in all the pairs (a free-text answer,
    a tool call with arguments no other turn repeats) is one judgement of one state, not a habit to unlearn: all such
    actions are one node that need not balance, so a pair of two of them is kept as it is, and a pair whose
    rejected turn is a one-off (garbled text) is kept only where the same action is also preferred over one.

    The cycles are peeled off in one depth-first walk over the edges (time linear in the number of pairs and
    actions): follow unused edges from action to action; an edge that comes back to an action on the current path
    closes a cycle, whose edges are kept; an action with no unused edge left is a dead end, and the edge that led to
    it lies on no cycle of the remaining edges, so it is dropped. What is dropped holds no cycle, so no balanced
    pairs could be added back: the subset is maximal, though not always the largest one. The order of the walk, and
    so which pairs of an edge are kept, is drawn with `seed`."""
    rng = random.Random(seed)
    occurrences = Counter(action for pair in pairs for action in (pair.chosen_action, pair.rejected_action))

    def node(action: str) -> str | None:
        return action if occurrences[action] > 1 else None  # None: every one-off action

    heads = [node(pair.rejected_action) for pair in pairs]
    outgoing: dict[str | None, list[int]] = {}
    for index, pair in enumerate(pairs):
        outgoing.setdefault(node(pair.chosen_action), []).append(index)
    for edges in outgoing.values():
        rng.shuffle(edges)
    starts = list(outgoing)
    rng.shuffle(starts)
    kept: list[int] = []
    for start in starts:
        path, path_edges, on_path = [start], [], {start: 0}
        while path:
            edges = outgoing.get(path[-1], [])
            if not edges:  # a dead end: the edge that led here is on no cycle
                del on_path[path.pop()]
                if path_edges:
                    path_edges.pop()
                continue
            edge = edges.pop()
            head = heads[edge]
            if head in on_path:  # back on the path: the edges from `head` on close a cycle
                at = on_path[head]
                kept += path_edges[at:] + [edge]
                for action in path[at + 1 :]:
                    del on_path[action]
                del path[at + 1 :], path_edges[at:]
            else:
                on_path[head] = len(path)
                path.append(head)
                path_edges.append(edge)
    return [pairs[index] for index in sorted(kept)]


def action_counts(pairs: Sequence[PreferencePair]) -> dict[str, dict[str, int]]:
    """How often each action is chosen and rejected, for the summary."""
    chosen, rejected = Counter(p.chosen_action for p in pairs), Counter(p.rejected_action for p in pairs)
    return {action: {"chosen": chosen[action], "rejected": rejected[action]} for action in sorted(chosen | rejected)}
