"""The documented trajectory schema, shared by the JSONL import command and the REST API."""

from __future__ import annotations

import hashlib
import json

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
        too_large = trajectory_size_problem(attrs["steps"])
        if too_large:
            raise serializers.ValidationError({"steps": too_large})
        task = attrs["task"]
        if not task.get("external_id") and task.get("seed") is None and not task.get("instruction"):
            raise serializers.ValidationError({"task": "Identify the task by external_id or seed, or give its text."})
        return attrs


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
        instruction = "\n\n".join(message["content"] for message in prompt if message.get("content"))
        for side in ("chosen", "rejected"):
            answer = _as_messages(attrs[side], side, "assistant")
            try:
                steps, _, trailing = messages_to_steps([*prompt, *answer])
            except serializers.ValidationError as exc:
                raise serializers.ValidationError({side: exc.detail["messages"]}) from None
            if not steps:
                raise serializers.ValidationError({side: "The answer needs at least one assistant message."})
            if trailing:
                raise serializers.ValidationError({side: "The answer must end with an assistant message."})
            attrs[f"{side}_steps"] = steps
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
        return [{"role": role, "content": value, "tool_calls": []}]
    if not isinstance(value, list) or not value:
        raise serializers.ValidationError({name: "Must be a string or a non-empty list of chat messages."})
    messages = MessageSerializer(data=value, many=True)
    if not messages.is_valid():
        raise serializers.ValidationError({name: messages.errors})
    return messages.validated_data


def _split_shared_prompt(chosen: list, rejected: list) -> tuple[list, list, list]:
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise serializers.ValidationError({"prompt": "chosen and rejected share no first message to take as prompt."})
    return chosen[:shared], chosen[shared:], rejected[shared:]
