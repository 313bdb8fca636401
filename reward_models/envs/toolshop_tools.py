"""The shop's six tools as OpenAI-style JSON schemas, checking a call against them (in the words a tool message
answers with), the JSON text of a tool's answer, and the shape of the assistant messages that make calls.

Nothing heavy is imported: the web side validates annotators' edited tool calls with ``schema_errors`` and
``check_tool_call``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reward_models import tool_schemas

MAX_QUANTITY = 9

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Find items whose name shares a word with the query.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "Words of the item's name."}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_item",
            "description": "Details of one item.",
            "parameters": {
                "type": "object",
                "properties": {"item_id": {"type": "string", "description": "The item's id, as search returns it."}},
                "required": ["item_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add_to_cart",
            "description": "Add a quantity of an item to the cart.",
            "parameters": {
                "type": "object",
                "properties": {
                    "item_id": {"type": "string", "description": "The item's id."},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": MAX_QUANTITY},
                },
                "required": ["item_id", "quantity"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "remove_from_cart",
            "description": "Remove an item from the cart, whatever its quantity.",
            "parameters": {
                "type": "object",
                "properties": {"item_id": {"type": "string", "description": "The item's id."}},
                "required": ["item_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view_cart",
            "description": "The cart's items and total.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "checkout",
            "description": "Place the order for the cart. Ends the session.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


TOOL_SCHEMAS: dict[str, dict[str, Any]] = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Where ``value`` breaks ``schema``, one message per problem, each starting with the field it concerns (the
    shared check, `reward_models.tool_schemas.schema_errors`, in the words a tool message answers with).

    >>> schema_errors({"quantity": "2"}, TOOL_SCHEMAS["add_to_cart"])
    ['item_id: required field missing', 'quantity: expected integer, got string']
    """
    return [
        f"{where or path or 'arguments'}: {reason}"
        for where, reason in tool_schemas.schema_errors(value, schema, path)
    ]


def check_tool_call(name: str, arguments: str, tools: Sequence[dict[str, Any]] = TOOLS) -> tuple[dict | None, str]:
    """Parse and validate one call against ``tools``: ``(arguments as a dict, "")`` or ``(None, error message)``.

    >>> check_tool_call("add_to_cart", '{"item_id": "kq48", "quantity": 0}')
    (None, 'add_to_cart: quantity: 0 is below the minimum 1')
    """
    schemas = {tool["function"]["name"]: tool["function"].get("parameters", {}) for tool in tools}
    if not name:
        return None, 'the tool call is not valid JSON of the form {"name": ..., "arguments": {...}}'
    if name not in schemas:
        return None, f"unknown tool {name!r}; tools: {', '.join(schemas)}"
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return None, f"{name}: arguments are not valid JSON ({exc.msg})"
    if not isinstance(parsed, dict):
        return None, f"{name}: arguments must be a JSON object, got {tool_schemas.json_type_name(parsed)}"
    errors = schema_errors(parsed, schemas[name])
    if errors:
        return None, f"{name}: {'; '.join(errors)}"
    return parsed, ""


def tool_call_message(calls: Sequence[tuple[str, dict[str, Any]]], content: str = "", first_id: int = 0) -> dict:
    """An assistant message (OpenAI shape) making ``calls``, each ``(name, arguments)``."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": f"call_{first_id + index}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
            for index, (name, arguments) in enumerate(calls)
        ],
    }


def message_calls(action: dict[str, Any] | str) -> list[tuple[str, str, str]]:
    """The ``(call id, tool name, arguments text)`` of each tool call of an action, tolerating malformed shapes (a
    call whose shape is unreadable gets the name ``""``, which the environment answers with an error)."""
    if not isinstance(action, dict):
        return []
    calls = []
    for index, call in enumerate(action.get("tool_calls") or []):
        call_id = f"call_{index}"
        name, arguments = "", ""
        if isinstance(call, dict):
            call_id = str(call.get("id") or call_id)
            function = call.get("function") if isinstance(call.get("function"), dict) else call
            name = function.get("name") if isinstance(function.get("name"), str) else ""
            raw = function.get("arguments", "")
            arguments = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
        calls.append((call_id, name, arguments))
    return calls


def tool_json(payload: Any) -> str:
    """The content of a tool's answer: `payload` as JSON text, non-ASCII characters kept."""
    return json.dumps(payload, ensure_ascii=False)
