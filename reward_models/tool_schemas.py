"""Checking tool-call arguments against a tool's JSON schema: what an environment answers a bad call with, and what
the annotator pages show beside a field of an edited call. No dependency: the subset tool schemas use.

Supported: ``type`` (object, array, string, integer, number, boolean, null, or a list of them), ``properties``,
``required``, ``additionalProperties: false``, ``items``, ``enum``, ``minimum``, ``maximum``, ``minLength`` and
``maxLength``. Booleans are not integers, as in JSON Schema.
"""

from __future__ import annotations

import json
from typing import Any

_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "null": type(None),
}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[tuple[str, str]]:
    """Where ``value`` breaks ``schema``: ``(field path, reason)`` per problem, the path dotted from the arguments
    (``""`` for the arguments themselves, ``items[2].sku`` inside).

    >>> schema_errors({"quantity": "2"}, {"type": "object", "required": ["item_id"],
    ...     "properties": {"item_id": {"type": "string"}, "quantity": {"type": "integer"}}})
    [('item_id', 'required field missing'), ('quantity', 'expected integer, got string')]
    """
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is_json_type(value, name) for name in names):
            return [(path, f"expected {' or '.join(names)}, got {json_type_name(value)}")]
    errors: list[tuple[str, str]] = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(option) for option in schema["enum"])
        errors.append((path, f"{json.dumps(value)} is not one of {allowed}"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append((path, f"{value} is below the minimum {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append((path, f"{value} is above the maximum {schema['maximum']}"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append((path, f"shorter than {schema['minLength']} characters"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append((path, f"longer than {schema['maxLength']} characters"))
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append((_join(path, name), "required field missing"))
        for name, item in value.items():
            if name in properties:
                errors.extend(schema_errors(item, properties[name], _join(path, name)))
            elif schema.get("additionalProperties", True) is False:
                errors.append((_join(path, name), f"unknown field (allowed: {', '.join(properties) or 'none'})"))
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{path}[{index}]"))
    return errors


def json_type_name(value: Any) -> str:
    for name in ("boolean", "null", "integer", "number", "string", "array", "object"):
        if _is_json_type(value, name):
            return name
    return type(value).__name__


def _is_json_type(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return name == "boolean"
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES.get(name, ()))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
