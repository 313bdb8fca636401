from __future__ import annotations

import json

import pytest

from reward_models.envs import Environment, Oracle
from reward_models.envs.toolshop import ToolShop
from reward_models.envs.toolshop_catalogue import DIFFICULTIES, ITEM_IDS, vocabulary_corpus
from reward_models.envs.toolshop_tools import TOOL_SCHEMAS, TOOLS, check_tool_call, schema_errors, tool_call_message
from reward_models.policy.chat_format import (
    QWEN_CHAT_TEMPLATE,
    build_bpe_tokenizer,
    format_assistant_text,
    parse_assistant_text,
    render_chat,
)


def solve(env: ToolShop, task: dict) -> tuple[list[dict], list]:
    """Play the oracle's canonical best action until the episode ends."""
    oracle = env.oracle(task)
    env.reset(task)
    actions, results = [], []
    while not results or not results[-1].done:
        actions.append(oracle.best_actions(actions)[0])
        results.append(env.step(actions[-1]))
    return actions, results


def call(name: str, **arguments) -> dict:
    return tool_call_message([(name, arguments)])


def raw_call(name: str, arguments: str) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


@pytest.fixture(scope="module")
def tokenizer():
    env = ToolShop()
    conversations = []
    for seed in range(60):
        task = env.make_task(seed)
        actions, results = solve(env, task)
        messages = [{"role": "user", "content": task["instruction"]}]
        for action, result in zip(actions, results, strict=True):
            messages += [action, *result.info["messages"]]
        conversations.append(render_chat(messages, TOOLS))
    return build_bpe_tokenizer(conversations + vocabulary_corpus(), 4096, added_tokens=ITEM_IDS)


# --- the environment -------------------------------------------------------------------------------------------------


def test_it_follows_the_environment_protocol_and_its_oracle_the_oracle_protocol():
    env = ToolShop()
    assert isinstance(env, Environment)
    assert isinstance(env.oracle(env.make_task(0)), Oracle)
    assert env.legal_actions() == []
    assert env.render("x") == {"kind": "text", "text": "x"}
    json.dumps(env.make_task(0))


def test_tasks_are_deterministic_per_seed_and_differ_between_seeds():
    first, second = ToolShop(), ToolShop()
    for seed in range(30):
        assert first.make_task(seed) == second.make_task(seed)
        assert first.scenario(first.make_task(seed)) == second.scenario(second.make_task(seed))
        assert first.reset(first.make_task(seed)) == first.make_task(seed)["instruction"]
    assert len({first.make_task(seed)["instruction"] for seed in range(30)}) > 20
    actions, _ = solve(first, first.make_task(7))
    replayed, _ = solve(second, second.make_task(7))
    assert actions == replayed


def test_a_task_replays_at_its_own_difficulty():
    hard_task = ToolShop(difficulty=3).make_task(11)
    assert ToolShop(difficulty=1).scenario(hard_task) == ToolShop(difficulty=3).scenario(hard_task)


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_the_oracle_solves_held_out_tasks_within_the_turn_limit(difficulty):
    env = ToolShop(difficulty=difficulty)
    for seed in list(env.eval_seeds())[:40]:
        task = env.make_task(seed)
        actions, results = solve(env, task)
        oracle = env.oracle(task)
        assert results[-1].info["success"] and results[-1].reward == 1.0
        assert len(actions) <= 5 < env.max_turns
        assert oracle.success(actions) and oracle.true_return(actions) == 1.0
        assert all(oracle.step_correct(actions))
        assert oracle.best_actions(actions) == []
        assert oracle.progress_return(actions) > 1.0


def test_search_results_need_a_lookup_from_difficulty_2():
    for difficulty, fewest in ((1, 1), (2, 2)):
        env = ToolShop(difficulty=difficulty)
        for seed in range(20):
            _, results = solve(env, env.make_task(seed))
            found = json.loads(results[0].observation)
            assert len(found) >= fewest and (difficulty > 1 or len(found) == 1)
            assert all(set(item) == {"name", "id", "price"} for item in found)


def test_bad_json_unknown_tools_and_schema_errors_are_answered_by_error_tool_messages():
    env = ToolShop()
    task = env.make_task(3)
    env.reset(task)
    broken = parse_assistant_text('<tool_call>\n{"name": "search", "arguments": {"query": "mug"}\n</tool_call>')
    actions = [
        broken,
        call("buy", item_id="kq48"),
        call("add_to_cart", item_id="kq48"),
        raw_call("search", '{"query": 3}'),
        call("add_to_cart", item_id="zz00", quantity=1),
    ]
    expected = ["not valid JSON", "unknown tool 'buy'", "quantity: required field missing", "query: expected string"]
    expected.append("no item with id 'zz00'")
    for action, fragment in zip(actions, expected, strict=True):
        result = env.step(action)
        (reply,) = result.info["messages"]
        assert reply["role"] == "tool" and reply["tool_call_id"] == action["tool_calls"][0]["id"]
        assert fragment in json.loads(reply["content"])["error"]
        assert result.info["invalid_calls"] == 1 and not result.done and result.reward == 0.0
    oracle = env.oracle(task)
    assert oracle.step_correct(actions) == [False] * len(actions)
    # The oracle recovers from all of it.
    while not (result := env.step(oracle.best_actions(actions)[0])).done:
        actions.append(oracle.best_actions(actions)[0])
    assert result.info["success"]


def test_parallel_calls_run_in_order_with_one_reply_each():
    env = ToolShop()
    task = env.make_task(5)
    target = env.scenario(task).goal[0]
    env.reset(task)
    message = tool_call_message(
        [
            ("search", {"query": "anything"}),
            ("add_to_cart", {"item_id": target.item_id, "quantity": 9}),
            ("view_cart", {}),
        ]
    )
    result = env.step(message)
    assert [reply["name"] for reply in result.info["messages"]] == ["search", "add_to_cart", "view_cart"]
    assert [reply["tool_call_id"] for reply in result.info["messages"]] == ["call_0", "call_1", "call_2"]
    assert json.loads(result.info["messages"][2]["content"])["cart"][0]["quantity"] == 9


def test_a_message_without_tool_calls_is_a_final_answer_that_ends_the_episode():
    env = ToolShop()
    task = env.make_task(2)
    for action in ("I bought it.", {"role": "assistant", "content": "Done.", "tool_calls": []}):
        env.reset(task)
        result = env.step(action)
        assert result.done and not result.info["success"] and result.info["final_answer"]
        assert result.info["messages"] == [] and result.reward == 0.0
    assert env.oracle(task).step_correct(["I bought it."]) == [False]


def test_the_episode_ends_at_the_turn_limit_and_a_wrong_order_fails():
    env = ToolShop(max_turns=3)
    task = env.make_task(4)
    env.reset(task)
    results = [env.step(call("view_cart")) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True] and not results[-1].info["success"]

    env = ToolShop()
    scenario = env.scenario(task)
    wrong = next(item for item in scenario.items if item.item_id != scenario.goal[0].item_id)
    actions = [call("add_to_cart", item_id=wrong.item_id, quantity=1), call("checkout")]
    env.reset(task)
    assert [env.step(a).done for a in actions] == [False, True]
    oracle = env.oracle(task)
    assert not oracle.success(actions) and oracle.best_actions(actions) == []
    assert oracle.progress_return(actions) < oracle.progress_return(actions[:1]) < 0.5


def test_wrong_cart_lines_are_repaired_by_the_oracle():
    env = ToolShop()
    task = env.make_task(8)
    line = env.scenario(task).goal[0]
    too_many = [call("add_to_cart", item_id=line.item_id, quantity=line.quantity + 1)]
    best = env.oracle(task).best_actions(too_many)
    assert json.loads(best[0]["tool_calls"][0]["function"]["arguments"]) == {"item_id": line.item_id}


# --- the schema validator --------------------------------------------------------------------------------------------


def test_schema_errors_name_the_field():
    schema = {
        "type": "object",
        "properties": {
            "size": {"type": "string", "enum": ["s", "m"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 3},
            "tags": {"type": "array", "items": {"type": "string"}},
            "gift": {"type": "boolean"},
            "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
        "required": ["size"],
        "additionalProperties": False,
    }
    value = {"count": 5, "tags": ["a", 2], "gift": 1, "address": {}, "colour": "red"}
    assert schema_errors(value, schema) == [
        "size: required field missing",
        "count: 5 is above the maximum 3",
        "tags[1]: expected string, got integer",
        "gift: expected boolean, got integer",
        "address.city: required field missing",
        "colour: unknown field (allowed: size, count, tags, gift, address)",
    ]
    assert schema_errors({"size": "xl", "count": True}, schema) == [
        'size: "xl" is not one of "s", "m"',
        "count: expected integer, got boolean",
    ]
    assert schema_errors({"size": "s", "count": 2.0}, schema) == []
    assert schema_errors([], schema) == ["arguments: expected object, got array"]


def test_check_tool_call_parses_and_validates():
    assert check_tool_call("add_to_cart", '{"item_id": "kq48", "quantity": 2}') == (
        {"item_id": "kq48", "quantity": 2},
        "",
    )
    assert check_tool_call("view_cart", "") == ({}, "")
    assert check_tool_call("search", "[1]")[1] == "search: arguments must be a JSON object, got array"
    assert (
        "quantity: 10 is above the maximum 9" in check_tool_call("add_to_cart", '{"item_id": "a", "quantity": 10}')[1]
    )
    assert set(TOOL_SCHEMAS) == {tool["function"]["name"] for tool in TOOLS}


# --- the chat format -------------------------------------------------------------------------------------------------


def test_parse_assistant_text_reads_plain_text_one_call_parallel_calls_and_broken_json():
    assert parse_assistant_text("  All done.  ") == {"role": "assistant", "content": "All done.", "tool_calls": []}

    one = parse_assistant_text(
        'Looking.\n<tool_call>\n{"name": "search", "arguments": {"query": "red mug"}}\n</tool_call>'
    )
    assert one["content"] == "Looking."
    assert one["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": '{"query": "red mug"}'}}
    ]

    two = parse_assistant_text(
        '<tool_call>\n{"name": "view_cart", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_item", "arguments": "{\\"item_id\\": \\"kq48\\"}"}\n</tool_call>',
        first_id=4,
    )
    assert [c["id"] for c in two["tool_calls"]] == ["call_4", "call_5"]
    assert [c["function"]["arguments"] for c in two["tool_calls"]] == ["{}", '{"item_id": "kq48"}']
    assert two["content"] == ""

    for broken in (
        '<tool_call>\n{"name": "search", "arguments": {"query": "mug"}\n</tool_call>',
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": {"query": "mug"}}',  # cut off
    ):
        (parsed,) = parse_assistant_text(broken)["tool_calls"]
        assert parsed["function"]["name"] == ""
        assert check_tool_call(parsed["function"]["name"], parsed["function"]["arguments"])[0] is None


def test_format_assistant_text_round_trips_through_the_parser():
    message = tool_call_message([("search", {"query": "red mug"}), ("view_cart", {})], content="Let me look.")
    assert parse_assistant_text(format_assistant_text(message)) == message


def test_the_template_renders_tool_calls_as_qwen_does_and_raw_text_the_same(tokenizer):
    env = ToolShop()
    task = env.make_task(1)
    actions, results = solve(env, task)
    as_calls = [{"role": "user", "content": task["instruction"]}]
    as_text = list(as_calls)
    for action, result in zip(actions, results, strict=True):
        as_calls += [action, *result.info["messages"]]
        as_text += [{"role": "assistant", "content": format_assistant_text(action)}, *result.info["messages"]]
    rendered = tokenizer.apply_chat_template(as_calls, tools=TOOLS, tokenize=False)
    assert rendered == tokenizer.apply_chat_template(as_text, tools=TOOLS, tokenize=False)
    assert rendered == render_chat(as_calls, TOOLS)
    assert tokenizer.chat_template == QWEN_CHAT_TEMPLATE
    assert rendered.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\nsearch(query)\n")
    assert "add_to_cart(item_id, quantity)" in rendered
    first_call = format_assistant_text(actions[0])
    assert f"<|im_start|>assistant\n{first_call}<|im_end|>\n<|im_start|>user\n<tool_response>\n[" in rendered
    assert first_call.startswith('<tool_call>\n{"name": "search", "arguments": {"query": ')
    prompt = tokenizer.apply_chat_template(as_calls[:1], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n") and rendered.startswith(prompt)
    without_tools = tokenizer.apply_chat_template(as_calls[:1], tokenize=False)
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert without_tools == f"{system}<|im_start|>user\n{task['instruction']}<|im_end|>\n"


def test_the_tokenizer_is_a_byte_level_bpe_with_single_token_ids_and_digits(tokenizer):
    assert len(tokenizer) >= 2000
    assert len(tokenizer) - len(ITEM_IDS) >= 2000  # the BPE itself, without the ids
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.tokenize('"id": "' + ITEM_IDS[0] + '"')[-2] == ITEM_IDS[0]
    assert [t for t in tokenizer.tokenize("price 1234") if t.isdigit()] == ["1", "2", "3", "4"]
    text = '<tool_call>\n{"name": "search", "arguments": {"query": "tëst"}}\n</tool_call>'
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


# --- the bootstrap ---------------------------------------------------------------------------------------------------


def test_a_turn_with_its_calls_in_its_text_shows_the_text_without_them_as_reasoning():
    from reward_models.conversation import message_tool_calls
    from reward_models.envs.base import describe_message
    from reward_models.policy.chat_format import format_tool_call

    env = ToolShop()
    text = "Looking it up.\n" + format_tool_call("search", {"query": "red mug"})
    message = {"role": "assistant", "content": text}
    reasoning, action = describe_message(env, message, message_tool_calls(message))
    assert reasoning == "Looking it up."
    assert "search" in action and "red mug" in action
    bare = {"role": "assistant", "content": format_tool_call("checkout", {})}
    assert describe_message(env, bare, message_tool_calls(bare))[0] == ""
