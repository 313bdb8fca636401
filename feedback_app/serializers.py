"""The documented trajectory schema, shared by the JSONL import command and the REST API."""

from __future__ import annotations

from rest_framework import serializers

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
    """One trajectory: either `steps`, or chat-style `messages` as agent frameworks write them.

    With `messages`, each assistant message becomes a step whose observation is the user and tool messages since
    the previous one; a leading system message becomes the task's instruction unless `task.instruction` is given.
    """

    external_id = serializers.CharField(max_length=255)
    task = TaskRefSerializer()
    policy = serializers.CharField(required=False, max_length=120, help_text="Policy version name; made if new.")
    source = serializers.ChoiceField(choices=["import", "human"], default="import")
    steps = StepSerializer(many=True, required=False)
    messages = MessageSerializer(many=True, required=False)
    outcome = OutcomeSerializer(required=False)
    metadata = serializers.DictField(required=False, default=dict)

    def validate(self, attrs: dict) -> dict:
        has_steps, has_messages = "steps" in attrs, "messages" in attrs
        if has_steps == has_messages:
            raise serializers.ValidationError({"steps": "Give exactly one of `steps` or `messages`."})
        if has_messages:
            attrs["steps"], instruction, trailing = messages_to_steps(attrs.pop("messages"))
            if instruction and not attrs["task"].get("instruction"):
                attrs["task"]["instruction"] = instruction
            if trailing:
                attrs["metadata"] = {**attrs["metadata"], "final_observation": trailing}
        if not attrs["steps"]:
            raise serializers.ValidationError({"steps": "A trajectory needs at least one step."})
        task = attrs["task"]
        if not task.get("external_id") and task.get("seed") is None and not task.get("instruction"):
            raise serializers.ValidationError({"task": "Identify the task by external_id or seed, or give its text."})
        return attrs


def messages_to_steps(messages: list[dict]) -> tuple[list[dict], str, str]:
    """Turn a chat transcript into (steps, system instruction, observation left after the last assistant turn)."""
    steps: list[dict] = []
    instruction_parts: list[str] = []
    pending: list[str] = []
    for message in messages:
        content = message.get("content") or ""
        role = message["role"]
        if role == "system" and not steps and not pending:
            instruction_parts.append(content)
        elif role in ("user", "tool", "system"):
            pending.append(f"[{message['name']}] {content}" if message.get("name") else content)
        else:
            steps.append(
                {
                    "observation": "\n".join(pending),
                    "reasoning": message.get("reasoning_content", ""),
                    "action": content,
                    "tool_calls": message.get("tool_calls", []),
                    "reward": 0.0,
                    "logprob": None,
                    "media": [],
                    "done": False,
                }
            )
            pending = []
    for step in steps:
        if not step["action"] and not step["tool_calls"]:
            raise serializers.ValidationError({"messages": "An assistant message needs content or tool calls."})
    return steps, "\n".join(instruction_parts), "\n".join(pending)
