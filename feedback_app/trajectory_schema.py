"""The documented trajectory schema, shared by the JSONL import command and the REST API."""

from __future__ import annotations

import hashlib
import json

from rest_framework import serializers

from reward_models.conversation import assistant_text, message_tool_calls, reply_text, split_conversation
from reward_models.policy.turns import format_decision

ROLES = ("system", "user", "assistant", "tool")


class ToolCallSerializer(serializers.Serializer):
    """One tool call. Accepts Tandem's flat form ({name, arguments}) and OpenAI's ({id, type, function: {...}})."""

    id = serializers.CharField(required=False, allow_blank=True)
    type = serializers.CharField(required=False, default="function")
    name = serializers.CharField(required=False)
    arguments = serializers.JSONField(required=False, default=dict)
    function = serializers.DictField(required=False)

    def validate(self, attrs: dict) -> dict:
        function = attrs.pop("function", None)
        if function is not None:
            if "name" not in function:
                raise serializers.ValidationError({"function": "A function call needs a name."})
            attrs.setdefault("name", function["name"])
            attrs["arguments"] = function.get("arguments", attrs.get("arguments", {}))
        if not attrs.get("name"):
            raise serializers.ValidationError({"name": "A tool call needs a name."})
        return attrs


class MediaSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["image", "audio", "video", "file"])
    url = serializers.CharField(max_length=2000)
    caption = serializers.CharField(required=False, allow_blank=True)


class StepSerializer(serializers.Serializer):
    observation = serializers.CharField(allow_blank=True, default="", trim_whitespace=False)
    reasoning = serializers.CharField(allow_blank=True, default="", trim_whitespace=False)
    action = serializers.CharField(allow_blank=True, default="", trim_whitespace=False)
    tool_calls = ToolCallSerializer(many=True, required=False, default=list)
    reward = serializers.FloatField(required=False, default=0.0)
    logprob = serializers.FloatField(required=False, allow_null=True, default=None)
    media = MediaSerializer(many=True, required=False, default=list)
    done = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs: dict) -> dict:
        if not attrs["action"] and not attrs["tool_calls"]:
            raise serializers.ValidationError({"action": "A step needs an action or at least one tool call."})
        return attrs


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES)
    content = serializers.CharField(allow_blank=True, allow_null=True, default="", trim_whitespace=False)
    reasoning_content = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    tool_calls = ToolCallSerializer(many=True, required=False, default=list)
    tool_call_id = serializers.CharField(required=False, allow_blank=True)
    name = serializers.CharField(required=False, allow_blank=True)


class TaskRefSerializer(serializers.Serializer):
    external_id = serializers.CharField(required=False, max_length=255)
    seed = serializers.IntegerField(required=False, allow_null=True)
    instruction = serializers.CharField(required=False, allow_blank=True, default="")
    spec = serializers.DictField(required=False, default=dict)


class OutcomeSerializer(serializers.Serializer):
    success = serializers.BooleanField(required=False, allow_null=True, default=None)
    # "return" is a keyword, so the field is named through `source`.
    return_ = serializers.FloatField(required=False, allow_null=True, default=None, source="outcome_return")

    def get_fields(self):
        fields = super().get_fields()
        fields["return"] = fields.pop("return_")
        return fields


class TrajectoryImportSerializer(serializers.Serializer):
    """One trajectory: either `steps`, or chat-style `messages` as agent frameworks write them (OpenAI's shape:
    system, user, assistant with `tool_calls`, tool).

    `messages` are stored verbatim (`reward_models.conversation`): the messages before the first assistant message
    are the prompt, each assistant message starts a step, and the messages after it up to the next are its replies;
    every export gives them back as they came. A leading system message becomes the task's instruction unless
    `task.instruction` is given. `tools` are the tool schemas the agent was offered (OpenAI's
    ``{"type": "function", "function": {...}}``); exports hand them to chat templates.
    """

    external_id = serializers.CharField(max_length=255)
    task = TaskRefSerializer()
    policy = serializers.CharField(required=False, max_length=120, help_text="Policy version name; made if new.")
    source = serializers.ChoiceField(choices=["import", "human"], default="import")
    steps = StepSerializer(many=True, required=False)
    messages = serializers.JSONField(
        required=False, help_text="Chat messages in OpenAI's shape (see MessageSerializer), stored verbatim."
    )
    tools = serializers.JSONField(required=False, help_text="The tool schemas the agent was offered.")
    outcome = OutcomeSerializer(required=False)
    metadata = serializers.DictField(required=False, default=dict)

    def validate_messages(self, value) -> list[dict]:
        return checked_messages(value)

    def validate_tools(self, value) -> list[dict]:
        return checked_tools(value)

    def validate(self, attrs: dict) -> dict:
        has_steps, has_messages = "steps" in attrs, "messages" in attrs
        if has_steps == has_messages:
            raise serializers.ValidationError({"steps": "Give exactly one of `steps` or `messages`."})
        if has_messages:
            attrs["prompt"], attrs["steps"] = steps_from_messages(attrs.pop("messages"))
            instruction = "\n".join(m.get("content") or "" for m in attrs["prompt"] if m.get("role") == "system")
            if instruction and not attrs["task"].get("instruction"):
                attrs["task"]["instruction"] = instruction
        elif attrs["steps"]:
            attrs["prompt"] = turns_for_steps(attrs["task"].get("instruction", ""), attrs["steps"])
        attrs.setdefault("tools", [])
        if not attrs["steps"]:
            raise serializers.ValidationError({"steps": "A trajectory needs at least one step."})
        too_large = trajectory_size_problem(attrs["steps"])
        if too_large:
            raise serializers.ValidationError({"steps": too_large})
        task = attrs["task"]
        if not task.get("external_id") and task.get("seed") is None and not task.get("instruction"):
            raise serializers.ValidationError({"task": "Identify the task by external_id or seed, or give its text."})
        return attrs


def checked_messages(value) -> list[dict]:
    """`value` if it is a list of chat messages in OpenAI's shape (roles, text or null content, tool calls with a
    function name and arguments); a ValidationError naming the message and its field otherwise. The messages are not
    changed: they are stored as they came."""
    if not isinstance(value, list) or not value:
        raise serializers.ValidationError("Must be a non-empty list of chat messages.")
    errors: list = []
    for message in value:
        checked = MessageSerializer(data=message)
        if not isinstance(message, dict):
            errors.append(["Must be a chat message (an object with a role)."])
        elif not checked.is_valid():
            errors.append(checked.errors)
        elif message["role"] == "assistant" and not (message.get("content") or message.get("tool_calls")):
            errors.append({"content": ["An assistant message needs content or tool calls."]})
        else:
            errors.append({})
    if any(errors):
        raise serializers.ValidationError(errors)
    return [_openai_calls(message) for message in value]


def _openai_calls(message: dict) -> dict:
    """The message as it came, except that tool calls in Tandem's flat form ({name, arguments}) are written in
    OpenAI's shape, which chat templates read; OpenAI-shaped messages are kept exactly."""
    calls = message.get("tool_calls")
    if not calls or all("function" in call for call in calls):
        return message
    written = [call if "function" in call else openai_tool_call(call, number) for number, call in enumerate(calls)]
    return {**message, "tool_calls": written}


def checked_tools(value) -> list[dict]:
    if not isinstance(value, list) or not all(
        isinstance(tool, dict) and isinstance(tool.get("function"), dict) and tool["function"].get("name")
        for tool in value
    ):
        raise serializers.ValidationError(
            'Must be a list of tool schemas: {"type": "function", "function": {"name": ..., "parameters": {...}}}.'
        )
    return value


def steps_from_messages(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """The prompt and the step rows of a verbatim transcript (`reward_models.conversation.split_conversation`), each
    step with its turn as the annotator pages show it."""
    prompt, turns = split_conversation(messages)
    seen = [message for message in prompt if message.get("role") != "system"]
    steps = []
    for turn in turns:
        calls = message_tool_calls(turn.message)
        content = turn.message.get("content") or ""
        if not isinstance(content, str):  # content parts: text and images
            content = json.dumps(content, ensure_ascii=False)
        steps.append(
            {
                "observation": reply_text(seen),
                "reasoning": turn.message.get("reasoning_content") or (content if calls else ""),
                "action": assistant_text({"tool_calls": calls}) if calls else content,
                "tool_calls": calls,
                "reward": 0.0,
                "logprob": None,
                "media": [],
                "done": False,
                "message": turn.message,
                "replies": list(turn.replies),
            }
        )
        seen = list(turn.replies)
    return prompt, steps


def turns_for_steps(instruction: str, steps: list[dict]) -> list[dict]:
    """Each of Tandem's step rows as a verbatim turn, and the trajectory's prompt: the turn is the
    ``<reasoning> ; action <action>`` text Tandem's text policies write (the reasoning alone when only tool calls
    act), with its tool calls in OpenAI's shape; the reply is the next step's observation."""
    for index, step in enumerate(steps):
        content = format_decision(step["reasoning"], step["action"]) if step["action"] else step["reasoning"]
        message = {"role": "assistant", "content": content}
        if step["tool_calls"]:
            message["tool_calls"] = [openai_tool_call(call, number) for number, call in enumerate(step["tool_calls"])]
        step["message"] = message
        step["tool_calls"] = message.get("tool_calls", [])
        following = steps[index + 1]["observation"] if index + 1 < len(steps) else None
        step["replies"] = [{"role": "user", "content": following}] if following is not None else []
    return [{"role": "system", "content": instruction}, {"role": "user", "content": steps[0]["observation"]}]


def openai_tool_call(call: dict, number: int) -> dict:
    """A tool call in OpenAI's shape: id, type, function with its name and its arguments as JSON text."""
    arguments = call.get("arguments", {})
    return {
        "id": call.get("id") or f"call_{number}",
        "type": call.get("type") or "function",
        "function": {
            "name": call["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False),
        },
    }


def trajectory_size_problem(steps: list[dict]) -> str | None:
    """Why a trajectory is too large to store (TANDEM_MAX_TRAJECTORY_STEPS, TANDEM_MAX_TRAJECTORY_BYTES), or None.
    Bytes count the steps' text in UTF-8 and their tool calls' arguments as JSON."""
    from django.conf import settings

    if len(steps) > settings.TANDEM_MAX_TRAJECTORY_STEPS:
        return (
            f"{len(steps)} steps; a trajectory may have at most {settings.TANDEM_MAX_TRAJECTORY_STEPS} "
            "(TANDEM_MAX_TRAJECTORY_STEPS)"
        )
    size = 0
    for step in steps:
        for name in ("observation", "reasoning", "action"):
            size += len(step.get(name, "").encode("utf-8", "surrogatepass"))
        for call in step.get("tool_calls", ()):
            size += len(json.dumps(call.get("arguments", {}), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > settings.TANDEM_MAX_TRAJECTORY_BYTES:
        return (
            f"{size} bytes of step text; a trajectory may have at most {settings.TANDEM_MAX_TRAJECTORY_BYTES} "
            "(TANDEM_MAX_TRAJECTORY_BYTES)"
        )
    return None


class PreferenceImportSerializer(serializers.Serializer):
    """One existing preference judgement: a prompt, the chosen answer and the rejected one.

    Each of `prompt`, `chosen` and `rejected` is a plain string or a list of chat messages (TRL's conversational
    format). Without `prompt`, chat-message `chosen` and `rejected` share it as their longest common prefix (TRL's
    implicit-prompt format). `annotator` names a project member to credit; by default the importing user is.
    """

    external_id = serializers.CharField(required=False, max_length=240)
    prompt = serializers.JSONField(required=False, help_text="A string, or a list of chat messages.")
    chosen = serializers.JSONField(help_text="The preferred answer: a string, or a list of chat messages.")
    rejected = serializers.JSONField(help_text="The other answer: a string, or a list of chat messages.")
    strength = serializers.IntegerField(required=False, min_value=1, max_value=3, default=2)
    margin = serializers.FloatField(required=False, allow_null=True, default=None)
    rationale = serializers.CharField(required=False, allow_blank=True, default="", trim_whitespace=False)
    annotator = serializers.CharField(required=False, max_length=150, help_text="Username of a project member.")
    metadata = serializers.DictField(required=False, default=dict)

    def validate_annotator(self, value: str) -> str:
        members = self.context.get("members")
        if members is not None and value not in members:
            raise serializers.ValidationError(f"No member of this project is named {value!r}.")
        return value

    def validate(self, attrs: dict) -> dict:
        if "prompt" not in attrs:
            if not (isinstance(attrs["chosen"], list) and isinstance(attrs["rejected"], list)):
                raise serializers.ValidationError(
                    {"prompt": "Give the prompt, or chosen and rejected as chat messages that begin with it."}
                )
            attrs["prompt"], attrs["chosen"], attrs["rejected"] = _split_shared_prompt(
                attrs["chosen"], attrs["rejected"]
            )
        prompt = _as_messages(attrs["prompt"], "prompt", "user")
        instruction = "\n\n".join(m["content"] for m in prompt if isinstance(m.get("content"), str) and m["content"])
        for side in ("chosen", "rejected"):
            answer = _as_messages(attrs[side], side, "assistant")
            if not any(message.get("role") == "assistant" for message in answer):
                raise serializers.ValidationError({side: "The answer needs at least one assistant message."})
            attrs[f"{side}_prompt"], attrs[f"{side}_steps"] = steps_from_messages([*prompt, *answer])
        prompt_key = json.dumps(attrs["prompt"], sort_keys=True, ensure_ascii=False)
        attrs["task"] = {
            "external_id": "prompt-" + hashlib.sha256(prompt_key.encode()).hexdigest()[:40],
            "instruction": instruction,
            "spec": {"prompt": attrs["prompt"]},
        }
        return attrs


def _as_messages(value, name: str, role: str) -> list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise serializers.ValidationError({name: "Must not be empty."})
        return [{"role": role, "content": value}]
    try:
        return checked_messages(value)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError({name: exc.detail}) from None


def _split_shared_prompt(chosen: list, rejected: list) -> tuple[list, list, list]:
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise serializers.ValidationError({"prompt": "chosen and rejected share no first message to take as prompt."})
    return chosen[:shared], chosen[shared:], rejected[shared:]
