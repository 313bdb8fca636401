"""The intervene page's editor of a chat turn: the assistant's text and its tool calls.

Each call names one of the task's tools, picked from a list, and its arguments are typed one field per property of
the tool's JSON schema: text, a number, true or false, one of an enum's values, or JSON for lists and objects. The
posted fields become one OpenAI-style assistant message (`turn_message`); a value that does not read as its type is
an error beside its field before anything is checked, and the schema's own check (`reward_models.envs.corrections`)
names its field as ``tool_calls.<i>.arguments.<field>``, which lands beside the same field. A turn without calls is
free text.

Fields are named ``content``, ``call_count``, ``call-<i>-name`` and ``call-<i>-arg-<property>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reward_models.conversation import message_tool_calls
from reward_models.policy.chat_format import parse_assistant_text

MAX_CALLS = 8  # tool calls in one corrected turn
INTEGER = re.compile(r"[+-]?\d+")
STEP_PREFIX = re.compile(r"^step \d+: ")  # how the intervention's check names a takeover turn


@dataclass
class ArgumentField:
    """One property of a tool's arguments, as an input."""

    key: str  # the posted field's name
    name: str
    widget: str  # "text", "number", "select" or "json"
    required: bool
    description: str
    value: str
    choices: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class CallEditor:
    index: int
    name: str
    arguments: list[ArgumentField]
    errors: list[str] = field(default_factory=list)


@dataclass
class TurnEditor:
    tools: list[str]
    content: str
    calls: list[CallEditor]
    errors: list[str] = field(default_factory=list)

    @property
    def can_add(self) -> bool:
        return len(self.calls) < MAX_CALLS

    @property
    def has_errors(self) -> bool:
        return bool(
            self.errors
            or any(call.errors or any(argument.errors for argument in call.arguments) for call in self.calls)
        )


def tool_parameters(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tool's JSON schema of its arguments, by tool name, in the order the task lists them."""
    schemas = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = dict(parameters) if isinstance(parameters, Mapping) else {}
    return schemas


def read_editor(
    params: Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]],
    *,
    interactive: bool,
    start: Mapping[str, Any] | None = None,
) -> TurnEditor:
    """The editor as the annotator left it: the posted text and calls, after "add a call" or "remove" when
    `interactive`. With nothing posted, it holds the `start` message (the policy's own turn, to be edited), or is
    empty."""
    schemas = tool_parameters(tools)
    if "call_count" not in params:
        return editor_from_message(start or {}, tools)
    count = _count(params.get("call_count"))
    indices = list(range(count))
    if interactive:
        removed = params.get("remove_call", "")
        if removed.isdigit() and int(removed) in indices:
            indices.remove(int(removed))
        if params.get("add_call") and len(indices) < MAX_CALLS:
            indices.append(-1)  # a new call, with the first tool
    calls = []
    for position, index in enumerate(indices):
        name = params.get(f"call-{index}-name", "") if index >= 0 else ""
        if name not in schemas:
            name = next(iter(schemas), "")
        fields = _argument_fields(position, schemas.get(name, {}), params, index)
        calls.append(CallEditor(position, name, fields))
    return TurnEditor(list(schemas), str(params.get("content", "")), calls)


def editor_from_message(message: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> TurnEditor:
    """An editor holding `message`: its text, and each call's tool and arguments in their fields. A call to a tool
    the task does not have, or arguments that are not a JSON object, leave that call's fields empty."""
    schemas = tool_parameters(tools)
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    if not message.get("tool_calls") and "<tool_call>" in content:  # a local model writes its calls in its text
        content = parse_assistant_text(content)["content"]
    calls = []
    written = message_tool_calls(dict(message)) if isinstance(message.get("tool_calls") or [], list) else []
    for position, call in enumerate(written[:MAX_CALLS]):
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        name = function.get("name") if isinstance(function, Mapping) else None
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        known = isinstance(name, str) and name in schemas
        values = {
            f"call-0-arg-{key}": value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            for key, value in (arguments.items() if known and isinstance(arguments, Mapping) else ())
        }
        name = name if known else next(iter(schemas), "")
        calls.append(CallEditor(position, name, _argument_fields(position, schemas.get(name, {}), values, 0)))
    return TurnEditor(list(schemas), content, calls)


def editor_message(editor: TurnEditor, tools: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The assistant message the editor holds, and whether every field read as its type (the ones that did not
    carry their error). A field left empty is left out of the arguments."""
    schemas = tool_parameters(tools)
    calls, readable = [], True
    for call in editor.calls:
        properties = schemas.get(call.name, {}).get("properties") or {}
        arguments: dict[str, Any] = {}
        for argument in call.arguments:
            if not argument.value.strip():
                continue
            try:
                arguments[argument.name] = _typed(argument.value, properties.get(argument.name) or {})
            except ValueError as exc:
                argument.errors.append(str(exc))
                readable = False
        calls.append(
            {
                "id": f"call_{call.index}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": editor.content.strip()}
    if calls:
        message["tool_calls"] = calls
    return message, readable


def attach_errors(editor: TurnEditor, errors: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Put each error of the intervention's check beside the editor's field it names (``tool_calls.<i>.name``,
    ``tool_calls.<i>.arguments[.<field>]``, the turn itself as ``corrected_action`` or, taking over, as
    ``takeover_actions``); returns the rest."""
    rest: dict[str, list[str]] = {}
    for key, messages in errors.items():
        messages = [STEP_PREFIX.sub("", message) for message in messages]  # beside its field, the step is plain
        match = re.fullmatch(r"tool_calls\.(\d+)\.(name|arguments)(?:\.([^.\[]+).*)?", key)
        call = editor.calls[int(match.group(1))] if match and int(match.group(1)) < len(editor.calls) else None
        if call is not None and match.group(3):
            argument = next((a for a in call.arguments if a.name == match.group(3)), None)
            if argument is not None:
                argument.errors.extend(messages)
                continue
        if call is not None:
            call.errors.extend(messages)
        elif key in ("corrected_action", "takeover_actions"):  # the turn in the editor, or a later one's end
            editor.errors.extend(messages)
        else:
            rest.setdefault(key, []).extend(messages)
    return rest


def _count(raw: Any) -> int:
    return min(int(raw), MAX_CALLS) if isinstance(raw, str) and raw.isdigit() else 0


def _argument_fields(
    position: int, schema: Mapping[str, Any], params: Mapping[str, Any], index: int
) -> list[ArgumentField]:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    fields = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, Mapping) else {}
        value = str(params.get(f"call-{index}-arg-{name}", "")) if index >= 0 else ""
        kind = spec.get("type")
        if "enum" in spec:
            widget, choices = "select", [_shown(option) for option in spec["enum"]]
        elif kind == "boolean":
            widget, choices = "select", ["true", "false"]
        elif kind in ("integer", "number"):
            widget, choices = "number", []
        elif kind == "string":
            widget, choices = "text", []
        else:
            widget, choices = "json", []
        fields.append(
            ArgumentField(
                key=f"call-{position}-arg-{name}",
                name=str(name),
                widget=widget,
                required=name in required,
                description=str(spec.get("description", "")),
                value=value,
                choices=choices,
            )
        )
    return fields


def _shown(option: Any) -> str:
    return option if isinstance(option, str) else json.dumps(option)


def _typed(value: str, spec: Mapping[str, Any]) -> Any:
    """A typed field's value as its schema's type; ValueError says what was expected."""
    text = value.strip()
    kind = spec.get("type")
    if "enum" in spec:
        for option in spec["enum"]:
            if _shown(option) == text:
                return option
        raise ValueError(f"pick one of {', '.join(_shown(option) for option in spec['enum'])}")
    if kind == "integer":
        if not INTEGER.fullmatch(text):
            raise ValueError(f"a whole number, not {text!r}")
        return int(text)
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"a number, not {text!r}") from None
        return int(number) if INTEGER.fullmatch(text) else number
    if kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError("true or false")
        return text == "true"
    if kind == "string":
        return value
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
