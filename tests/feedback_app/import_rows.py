"""Rows of the trajectory import format, as the import endpoint and the `import_trajectories` command read them."""

from __future__ import annotations

import json


def import_row(external_id: str = "ep-1", *, last_step: dict | None = None, **overrides) -> dict:
    """A row in which policy "my-agent-v3" books a flight to Oslo on task "task-1" in two steps, a search and then a
    `book` tool call, and succeeds with return 1.0. As it stands the row is plain (the importer's fast path takes
    it); `last_step` replaces the `book` step and `overrides` replace whole fields."""
    book = {"observation": "3 results", "action": "", "tool_calls": [{"name": "book", "arguments": {"id": 1}}]}
    row = {
        "external_id": external_id,
        "task": {"external_id": "task-1", "instruction": "book a flight to Oslo"},
        "policy": "my-agent-v3",
        "steps": [
            {"observation": "home page", "reasoning": "search first", "action": "search('Oslo')", "reward": 0.0},
            last_step or book,
        ],
        "outcome": {"success": True, "return": 1.0},
    }
    return {**row, **overrides}


def as_json_lines(rows: list) -> bytes:
    """`rows` as a JSON Lines file: each dict as one line of JSON, each string as it is (a blank or broken line)."""
    return ("\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows) + "\n").encode()
