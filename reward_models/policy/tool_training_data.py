"""The tool policy's training rows: the shop oracle's scripted demonstrations (with deliberate mistakes the oracle
then recovers from), encoded with labels on the learned assistant turns only, and the synthetic copy drill that
teaches a small model to copy from its context before it sees a demonstration.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from reward_models.envs.base import message_action, prompt_messages, reply_messages, task_tools, training_seeds
from reward_models.envs.toolshop import ToolShop
from reward_models.envs.toolshop_catalogue import ITEM_IDS
from reward_models.envs.toolshop_tools import message_calls, tool_call_message
from reward_models.policy.chat_format import IM_END, IM_START, format_assistant_text


@dataclass
class Demonstration:
    """One scripted episode: the conversation (assistant turns as raw text) and which assistant turns to learn."""

    task: dict[str, Any]
    messages: list[dict[str, Any]]
    learn: list[bool]  # one per assistant message: False for the demonstrator's deliberate mistakes
    success: bool


_UNKNOWN_TOOLS = ("buy", "add_item", "find", "cart", "order", "purchase", "lookup")


def demonstrations(
    env: ToolShop, n_episodes: int, noise: float, seed: int, first_seed: int = 0
) -> list[Demonstration]:
    """Scripted episodes on training seeds from ``first_seed`` up (never the held-out ones), each turn played and
    recorded as a rollout plays it: the assistant message is the raw text, answered by the environment's replies."""
    rng = random.Random(seed)
    episodes = []
    for task_seed in training_seeds(env, n_episodes, start=first_seed):
        task = env.make_task(task_seed)
        oracle = env.oracle(task)
        scenario = env.scenario(task)
        messages = prompt_messages(env, task, env.reset(task))
        learn: list[bool] = []
        seen: list[str] = []
        done, success = False, False
        while not done:
            best = oracle.best_actions_at(env.state)
            # No mistake where the repair would not fit in the turns left, so every demonstration succeeds.
            turns_left = env.max_turns - len(learn)
            mistake = turns_left > env.state.calls_to_go() + 2 and rng.random() < noise
            text = _mistake(rng, best[0], scenario, seen) if mistake else format_assistant_text(best[0])
            message = {"role": "assistant", "content": text}
            result = env.step(message_action(env, message))
            learn.append(not mistake)
            replies = reply_messages(result)
            messages += [message, *replies]
            for reply in replies:
                seen.extend(re.findall(r'"id": "(\w+)"', reply["content"]))
            done, success = result.done, result.info["success"]
        episodes.append(Demonstration(task, messages, learn, success))
    return episodes


def _mistake(rng: random.Random, best: dict[str, Any], scenario: Any, seen: list[str]) -> str:
    """A plausible wrong assistant turn near the oracle's ``best`` one, as raw text."""
    ((_, name, arguments),) = message_calls(best)
    args = json.loads(arguments)
    goal_ids = {line.item_id for line in scenario.goal}
    wrong_seen = [item_id for item_id in seen if item_id not in goal_ids]
    kinds = ["bad_json", "unknown_tool", "schema", "made_up_id", "wasted"]
    if wrong_seen:
        kinds.append("wrong_item")
    if name == "add_to_cart":
        kinds.append("wrong_quantity")
    kind = rng.choice(kinds)
    if kind == "bad_json":
        text = format_assistant_text(best)
        cut = rng.choice(['"}}', "}}", '", "', '": '])
        return text.replace(cut, cut[:-1], 1) if cut in text else text.replace("}", "", 1)
    if kind == "unknown_tool":
        return format_assistant_text(tool_call_message([(rng.choice(_UNKNOWN_TOOLS), args)]))
    if kind == "schema":
        if name == "add_to_cart":
            broken = {"item_id": args["item_id"], "quantity": str(args["quantity"])}
        elif name == "search":
            broken = {"q": args["query"]}
        else:
            broken = {"item_id": rng.choice(seen)} if seen else {"query": 1}
        return format_assistant_text(tool_call_message([(name, broken)]))
    if kind == "made_up_id":
        item_id = rng.choice([i for i in ITEM_IDS if scenario.item(i) is None])
        return format_assistant_text(tool_call_message([("add_to_cart", {"item_id": item_id, "quantity": 1})]))
    if kind == "wrong_item":
        quantity = rng.randint(1, 5)
        return format_assistant_text(
            tool_call_message([("add_to_cart", {"item_id": rng.choice(wrong_seen), "quantity": quantity})])
        )
    if kind == "wrong_quantity":
        quantity = rng.choice([q for q in range(1, 6) if q != args["quantity"]])
        return format_assistant_text(
            tool_call_message([("add_to_cart", {"item_id": args["item_id"], "quantity": quantity})])
        )
    wasted = ("get_item", {"item_id": rng.choice(seen)}) if seen and rng.random() < 0.5 else ("view_cart", {})
    return format_assistant_text(tool_call_message([wasted]))


def encode_demonstration(tokenizer: Any, demonstration: Demonstration) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and labels that are -100 except on learned assistant turns.

    The conversation is rendered once with the chat template, then cut into segments at each assistant turn's text
    and its ``<|im_end|>``, which are tokenised on their own, as the policy generates them after the prompt."""
    return encode_demonstrations(tokenizer, [demonstration])[0]


def encode_demonstrations(tokenizer: Any, demos: list[Demonstration]) -> list[tuple[list[int], list[int]]]:
    """``encode_demonstration`` for many, with one tokenizer call for all their segments."""
    layouts = []
    for demonstration in demos:
        text = tokenizer.apply_chat_template(
            demonstration.messages, tools=task_tools(demonstration.task), tokenize=False
        )
        layouts.append(split_assistant_segments(text))
    segments = [segment for texts, _ in layouts for segment in texts]
    encoded = iter(_encode_batch(tokenizer, segments))
    rows = []
    for demonstration, (_, flags) in zip(demos, layouts, strict=True):
        input_ids: list[int] = []
        labels: list[int] = []
        turn = 0
        for is_assistant in flags:
            piece = next(encoded)
            input_ids.extend(piece)
            learn = is_assistant and demonstration.learn[turn]
            labels.extend(piece if learn else [-100] * len(piece))
            turn += is_assistant
        rows.append((input_ids, labels))
    return rows


def _encode_batch(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    # The Rust tokenizer directly: transformers' per-text bookkeeping costs more than the tokenising itself.
    return [encoding.ids for encoding in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]


def training_row(input_ids: list[int], labels: list[int]) -> tuple[list[int], list[int]]:
    """A demonstration cut after its last learned token: what follows (the checkout's reply) teaches nothing."""
    end = max(index for index, label in enumerate(labels) if label != -100) + 1
    return input_ids[:end], labels[:end]


_ASSISTANT_TURN = re.compile(re.escape(f"{IM_START}assistant\n") + r"(.*?" + re.escape(IM_END) + ")", re.S)


def split_assistant_segments(text: str) -> tuple[list[str], list[bool]]:
    """Cut a rendered conversation into segments, each flagged True when it is an assistant turn's text with its
    closing ``<|im_end|>`` (what the policy generates) and False for everything else (the prompt it reads)."""
    segments: list[str] = []
    flags: list[bool] = []
    position = 0
    for match in _ASSISTANT_TURN.finditer(text):
        segments.append(text[position : match.start(1)])
        flags.append(False)
        segments.append(match.group(1))
        flags.append(True)
        position = match.end(1)
    if position < len(text):
        segments.append(text[position:])
        flags.append(False)
    return segments, flags


def copy_drill_rows(tokenizer: Any, count: int, length: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Synthetic copying exercises, alternately of two kinds, each opened by ``<|im_start|>`` and shown again after
    ``<|im_end|>``, with the loss on the second showing:

    - ``length`` random tokens of the kinds the policy copies (item ids, colour and product words, digits);
    - a search result (a JSON list of 3 to 8 random items) whose items come again one by one in a shuffled order:
      every token of an item after its first word is to be copied from the list.

    A small transformer learns to copy within a couple of hundred steps of these, where the shop's conversations,
    with a handful of copied tokens among hundreds, leave it guessing constants for thousands of steps."""
    from reward_models.envs.toolshop_catalogue import COLOURS, PRODUCTS

    words = [f" {word}" for word in COLOURS + PRODUCTS] + list(COLOURS) + list(PRODUCTS)
    pieces = tokenizer(words + list("0123456789"), add_special_tokens=False)["input_ids"]
    content = sorted({piece[0] for piece in pieces} | set(tokenizer.convert_tokens_to_ids(list(ITEM_IDS))))
    start, end = tokenizer.convert_tokens_to_ids([IM_START, IM_END])
    rng = random.Random(seed)
    # Lookup rows as (text, learned) pieces, tokenised together at the end: one tokenizer call, not thousands.
    layouts: list[list[tuple[str, bool]] | list[int]] = []
    for index in range(count):
        if index % 2 == 0:
            layouts.append([rng.choice(content) for _ in range(length)])
            continue
        size = rng.randint(3, 8)
        items = [
            {"name": f"{rng.choice(COLOURS)} {product}", "id": item_id, "price": rng.randint(2, 99)}
            for product, item_id in zip(rng.sample(PRODUCTS, size), rng.sample(ITEM_IDS, size), strict=True)
        ]
        pieces_of_row: list[tuple[str, bool]] = [(json.dumps(items), False)]
        for item in rng.sample(items, size):
            text = " " + json.dumps(item)
            cue = len(' {"name": "') + item["name"].index(" ")
            pieces_of_row += [(text[:cue], False), (text[cue:], True)]
        layouts.append(pieces_of_row)
    texts = [text for layout in layouts if isinstance(layout[0], tuple) for text, _ in layout]
    encoded = iter(_encode_batch(tokenizer, texts))
    rows = []
    for layout in layouts:
        if not isinstance(layout[0], tuple):
            rows.append(([start, *layout, end, *layout], [-100] * (length + 2) + layout))
            continue
        input_ids, labels = [start], [-100]
        for position, (_, learned) in enumerate(layout):
            ids = next(encoded)
            input_ids += ids
            labels += ids if learned else [-100] * len(ids)
            if position == 0:
                input_ids.append(end)
                labels.append(-100)
        rows.append((input_ids, labels))
    return rows
