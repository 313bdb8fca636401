"""A tiny tool-calling chat world for tests of the judges and policy trainers on chat models.

Two tools, Qwen2.5's chat format (`reward_models.policy.chat_format`), a byte-level BPE and a tiny Qwen2 built
locally; trajectory conversations whose turns write their tool calls both ways (an OpenAI ``tool_calls`` field, and
Qwen ``<tool_call>`` markup in the text, as a local model generates it), answered by tool messages, the last turn's
results ending the conversation; and `ToolCounter`, a two-turn environment whose tasks offer the tools, for the online
trainers. Rows built here have the exports' conversational layouts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reward_models.conversation import StepTurn, build_conversation
from reward_models.envs.base import StepResult
from reward_models.policy.chat_format import format_tool_call, render_chat

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Find items.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add an item to the cart.",
            "parameters": {
                "type": "object",
                "properties": {"item_id": {"type": "string"}, "quantity": {"type": "integer"}},
                "required": ["item_id", "quantity"],
            },
        },
    },
]
# What the chat template writes into the system turn when it is given TOOLS.
TOOLS_BLOCK = "# Tools\nsearch(query)\nadd(item_id, quantity)"
SYSTEM = "You are a shop assistant."
# A policy run's settings that put it on `ToolCounter` (whose constructor takes no settings).
RUN_ENVIRONMENT = {"environment": "tests.reward_models.tool_chat.ToolCounter", "environment_config": {}}


def field_call(name: str, arguments: dict[str, Any], call_id: str = "call_0") -> dict[str, Any]:
    """An assistant message with an OpenAI-style ``tool_calls`` field (an endpoint's or an import's turn)."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def markup_call(name: str, arguments: dict[str, Any], thought: str = "") -> dict[str, Any]:
    """An assistant message as a local Qwen-style model writes it: the text it generated, tool-call markup included."""
    call = format_tool_call(name, arguments)
    return {"role": "assistant", "content": f"{thought}\n{call}" if thought else call}


def tool_reply(name: str, content: Any, call_id: str = "call_0") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": json.dumps(content)}


def prompt(quantity: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Add k7 quantity {quantity}."}]


def trajectory(quantity: int, added: int):
    """A three-turn trajectory conversation: a search (a ``tool_calls`` field), an add of `added` items (markup, with
    a thought before it), and a plain answer; each call answered by a tool message."""
    steps = [
        StepTurn(field_call("search", {"query": "k7"}), [tool_reply("search", [{"id": "k7"}])]),
        StepTurn(
            markup_call("add", {"item_id": "k7", "quantity": added}, thought="found it"),
            [tool_reply("add", {"k7": added})],
        ),
        StepTurn({"role": "assistant", "content": "done"}, [{"role": "user", "content": "thanks"}]),
    ]
    return build_conversation(prompt(quantity), steps)


def episode(quantity: int, added: int):
    """`trajectory` as a rollout's `Episode` (what the online trainers' judges score)."""
    from reward_models.rollout import Episode, Step

    conversation = trajectory(quantity, added)
    steps = []
    for index in range(conversation.num_steps):
        message = conversation.assistant(index)
        replies = conversation.messages[conversation.step_starts[index] + 1 : conversation.step_end(index)]
        steps.append(Step("", message, replies, "", "", message["content"], reward=0.0, done=False))
    task = {"seed": quantity, "instruction": conversation.messages[1]["content"], "tools": TOOLS}
    return Episode(task, 0, steps, "", 0.0, False, False, conversation.prompt, TOOLS)


def preference_rows(count: int = 6) -> list[dict[str, Any]]:
    """`preference` rows: the trajectory that adds the asked quantity over one that adds another."""
    rows = []
    for index in range(count):
        quantity = 1 + index % 4
        good, bad = trajectory(quantity, quantity), trajectory(quantity, quantity + 1)
        cut = good.prompt_length
        rows.append(
            {
                "prompt": good.messages[:cut],
                "chosen": good.messages[cut:],
                "rejected": bad.messages[cut:],
                "margin": 0.5,
                "task_id": index,
                "tie": False,
                "tools": TOOLS,
            }
        )
    return rows


def step_preference_rows(count: int = 6) -> list[dict[str, Any]]:
    """`step_preference` rows at the add step: everything before it, then the right add over a wrong one."""
    rows = []
    for index in range(count):
        quantity = 1 + index % 4
        good, bad = trajectory(quantity, quantity), trajectory(quantity, quantity + 1)
        rows.append(
            {
                "prompt": good.before_step(1),
                "chosen": [good.assistant(1)],
                "rejected": [bad.assistant(1)],
                "margin": 1.0,
                "source": "intervention",
                "step_index": 1,
                "task_id": index,
                "tools": TOOLS,
            }
        )
    return rows


def stepwise_rows(count: int = 6) -> list[dict[str, Any]]:
    """`stepwise` rows: every step of a trajectory labelled, the add step good when it adds the asked quantity."""
    from reward_models.policy.turns import message_steps

    rows = []
    for index in range(count):
        quantity, added = 1 + index % 4, 1 + index % 4 + index % 2
        prompt_messages, pieces = message_steps(trajectory(quantity, added).messages)
        labels = [True, added == quantity, True]
        rows.append({"prompt": prompt_messages, "completions": pieces, "labels": labels, "task_id": index})
        rows[-1].update(source="label", tools=TOOLS)
    return rows


def tokenizer_corpus() -> list[str]:
    texts = [render_chat(trajectory(q, a).messages, TOOLS) for q in range(1, 6) for a in range(1, 7)]
    return [*texts, "Add k7 quantity", "found it done thanks 0 1 2 3 4 5 6 7 8 9", json.dumps(TOOLS)]


def build_tool_policy(path: Path, *, seed: int = 0) -> Path:
    """A tiny untrained Qwen2 with a byte-level BPE and the Qwen chat template: a policy directory, and a base for
    the judge models."""
    from reward_models.policy.chat_format import build_bpe_tokenizer
    from reward_models.policy.model import build_tiny_qwen2, save_policy

    tokenizer = build_bpe_tokenizer(tokenizer_corpus(), 512)
    model = build_tiny_qwen2(tokenizer, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, seed=seed)
    return save_policy(model, tokenizer, path, history_window=None, max_new_tokens=12)


@pytest.fixture(scope="session")
def tool_policy_dir(tmp_path_factory) -> Path:
    """A tiny tool-calling chat policy (`build_tool_policy`), shared by the tests that train on tool calls."""
    return build_tool_policy(tmp_path_factory.mktemp("tool-policy"))


def assistant_spans(tokenizer, text: str) -> list[str]:
    """The assistant turns of a rendered conversation, each with its end-of-turn token: what a loss mask on the
    assistant's own tokens keeps."""
    spans = []
    for part in text.split("<|im_start|>assistant\n")[1:]:
        spans.append(part.split(tokenizer.eos_token)[0] + tokenizer.eos_token)
    return spans


class ToolCounter:
    """A two-turn environment whose tasks offer TOOLS: the task asks for a quantity of item ``k7``; each tool call is
    answered by a tool message, and the episode ends after two turns or at a turn without tool calls, rewarded 1 when
    an ``add`` call asked for the right quantity."""

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns

    def make_task(self, seed: int) -> dict[str, Any]:
        return {
            "seed": seed,
            "instruction": f"Add k7 quantity {1 + seed % 4}.",
            "quantity": 1 + seed % 4,
            "tools": TOOLS,
        }

    def eval_seeds(self) -> range:
        return range(1000, 1004)

    def reset(self, task: dict[str, Any]) -> str:
        self.task, self.taken, self.added = task, 0, False
        return task["instruction"]

    def prompt_messages(self, task: dict[str, Any], first_observation: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first_observation}]

    def action_from_message(self, message: dict[str, Any]) -> dict[str, Any]:
        return message

    def step(self, action: dict[str, Any]) -> StepResult:
        self.taken += 1
        replies = []
        for call in action.get("tool_calls") or []:
            function = call["function"]
            try:
                arguments = json.loads(function["arguments"])
            except (TypeError, ValueError):
                arguments = {}
            if function["name"] == "add" and arguments == {"item_id": "k7", "quantity": self.task["quantity"]}:
                self.added = True
            replies.append(tool_reply(function["name"], {"ok": True}, call.get("id", "call_0")))
        done = self.taken >= self.turns or not replies
        info = {"messages": replies} if replies else {}
        info["success"] = self.added
        return StepResult("\n".join(reply["content"] for reply in replies), float(done and self.added), done, info)

    def legal_actions(self) -> list[str]:
        return []

    def render(self, observation: str) -> dict[str, Any]:
        return {"kind": "text", "text": observation}

    def oracle(self, task: dict[str, Any]) -> None:
        return None
