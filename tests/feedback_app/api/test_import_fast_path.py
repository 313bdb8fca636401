"""The import's fast path for plain trajectory rows must agree with TrajectoryImportSerializer, the schema's
definition: whatever it accepts, the serializer accepts with the same validated data, and it never accepts a row
the serializer refuses."""

from __future__ import annotations

import json
import random

from feedback_app.imports.fast_path import plain_trajectory_row
from feedback_app.trajectory_schema import TrajectoryImportSerializer

ODD_TEXT = ["", " padded ", "x\x00y", "\ud800", 7, 1.5, True, None, [], {}, "ok", "ünïcode", "a" * 300]
ODD_NUMBERS = [0, 1, -2.5, 2**60, float("nan"), float("inf"), True, "1.5", None, "x", 3.0]


def _random_row(rng: random.Random, n: int) -> dict:
    p_odd = rng.choice([0.0, 0.02, 0.15])  # how often a field gets an odd value in this row

    def maybe(good, odd: list, scale: float = 1.0):
        return rng.choice(odd) if rng.random() < p_odd * scale else good

    row: dict = {"external_id": maybe(f"ep-{n}", ODD_TEXT)}
    task: dict = {}
    for name, good in (("external_id", f"t-{n % 7}"), ("seed", n), ("instruction", "reach G"), ("spec", {"k": 1})):
        if rng.random() < 0.6:
            task[name] = maybe(good, ODD_TEXT if name != "seed" else ODD_NUMBERS)
    row["task"] = maybe(task, ["task-1", None, []], 0.3)
    if rng.random() < 0.5:
        row["policy"] = maybe("agent-v1", ODD_TEXT)
    if rng.random() < 0.3:
        row["source"] = maybe(rng.choice(["import", "human"]), ["policy", "", 1])
    steps = []
    for j in range(rng.randint(0, 3)):
        step: dict = {}
        for name in ("observation", "reasoning", "action"):
            if rng.random() < 0.8:
                step[name] = maybe(f"{name} {j}", ODD_TEXT)
        if rng.random() < 0.4:
            call: dict = rng.choice(
                [
                    {"name": "search", "arguments": {"q": "milk"}},
                    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": 1}'}},
                    {"name": "", "arguments": None},
                    {"function": {"arguments": "{}"}},
                    {"name": " padded "},
                    {"name": "x", "type": ""},
                    {"name": "x", "function": {"name": "y"}},
                    {"id": " c2", "name": "x"},
                ]
            )
            step["tool_calls"] = maybe([call], [None, "call", [1]], 0.7)
        for name in ("reward", "logprob"):
            if rng.random() < 0.5:
                step[name] = maybe(rng.uniform(-2, 2), ODD_NUMBERS, 2)
        if rng.random() < 0.3:
            step["done"] = maybe(rng.random() < 0.5, ["true", 1, None])
        if rng.random() < 0.1:
            step["media"] = [{"type": "image", "url": "https://example.test/a.png"}]
        steps.append(maybe(step, [None, "step", []], 0.3))
    row["steps"] = maybe(steps, [None, {}], 0.3)
    if rng.random() < 0.05:
        row["messages"] = [{"role": "assistant", "content": "hi"}]
    if rng.random() < 0.5:
        outcome = {
            "success": maybe(rng.random() < 0.5, ["yes", 1, None]),
            "return": maybe(0.5, ODD_NUMBERS),
        }
        row["outcome"] = maybe(outcome, [None, [], "won"], 0.7)
    if rng.random() < 0.3:
        row["metadata"] = maybe({"seed": n}, [None, [], "x"], 1.3)
    return row


def _canonical(data) -> str:
    return json.dumps(data, sort_keys=True)


def test_the_fast_path_agrees_with_the_serializer_on_random_rows():
    rng = random.Random(20261121)
    accepted = refused_by_both = 0
    for n in range(3000):
        row = _random_row(rng, n)
        fast = plain_trajectory_row(row)
        serializer = TrajectoryImportSerializer(data=row)
        valid = serializer.is_valid()
        if fast is not None:
            assert valid, (row, serializer.errors)
            assert _canonical(fast) == _canonical(serializer.validated_data), row
            accepted += 1
        elif not valid:
            refused_by_both += 1
    # The generator must exercise both sides, or the test proves nothing.
    assert accepted > 300 and refused_by_both > 300, (accepted, refused_by_both)


def test_a_typical_agent_row_takes_the_fast_path():
    row = {
        "external_id": "run7-ep12",
        "task": {"external_id": "book-oslo", "instruction": "Book a flight to Oslo"},
        "policy": "my-agent-v3",
        "steps": [
            {"observation": "home", "reasoning": "search", "action": "search('Oslo')", "reward": 0, "logprob": -1.2},
            {"observation": "results", "tool_calls": [{"name": "book", "arguments": {"flight": "SK123"}}]},
        ],
        "outcome": {"success": True, "return": 1},
        "metadata": {"agent": "v3"},
    }
    fast = plain_trajectory_row(row)
    serializer = TrajectoryImportSerializer(data=row)
    assert serializer.is_valid() and fast is not None
    assert _canonical(fast) == _canonical(serializer.validated_data)
