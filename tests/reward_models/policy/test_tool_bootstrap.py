"""The built-in tool-calling policy: its demonstrations, copy drill and tokenizer, the shipped weights (they load,
speak the chat format and solve held-out tasks), and when the bootstrap copies them instead of training."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from reward_models.envs.base import message_action
from reward_models.envs.toolshop import ToolShop
from reward_models.envs.toolshop_catalogue import ITEM_IDS
from reward_models.policy import tool_bootstrap as tb
from reward_models.policy import tool_training_data as training_data
from reward_models.policy.chat_format import TOOL_CALL_END, TOOL_CALL_START, parse_assistant_text


@pytest.fixture(scope="module")
def shipped():
    from reward_models.policy.local import LocalCausalLMPolicy

    return LocalCausalLMPolicy(tb.SHIPPED_DIR)


def test_every_demonstration_succeeds_and_only_its_correct_turns_are_learned():
    env = ToolShop(difficulty=2)
    demos = training_data.demonstrations(env, 60, noise=0.3, seed=1)
    assert all(demo.success for demo in demos)
    mistakes = [not learn for demo in demos for learn in demo.learn]
    assert 0 < sum(mistakes) < len(mistakes)
    for demo in demos:
        assert demo.messages[:2] == [
            {"role": "system", "content": env.prompt_messages(demo.task, "")[0]["content"]},
            {"role": "user", "content": demo.task["instruction"]},
        ]
        oracle = env.oracle(demo.task)
        turns = [m for m in demo.messages if m["role"] == "assistant"]
        correct = oracle.step_correct([message_action(env, turn) for turn in turns])
        # The turns kept for learning are the oracle's; some of the others are its mistakes.
        assert all(ok for ok, learn in zip(correct, demo.learn, strict=True) if learn)


def test_the_loss_covers_the_learned_assistant_turns_and_nothing_else():
    from reward_models.policy.chat_format import build_bpe_tokenizer, render_chat

    env = ToolShop()
    demos = training_data.demonstrations(env, 40, noise=0.4, seed=2)
    tokenizer = build_bpe_tokenizer([render_chat(d.messages, d.task["tools"]) for d in demos], 2000)
    demo = next(d for d in demos if not all(d.learn))
    input_ids, labels = training_data.encode_demonstration(tokenizer, demo)
    assert tokenizer.decode(input_ids) == tokenizer.apply_chat_template(
        demo.messages, tools=demo.task["tools"], tokenize=False
    )
    learned = tokenizer.decode([token for token, label in zip(input_ids, labels, strict=True) if label != -100])
    wanted = [m["content"] + "<|im_end|>" for m, learn in zip(_assistant(demo), demo.learn, strict=True) if learn]
    assert learned == "".join(wanted)


def _assistant(demo):
    return [message for message in demo.messages if message["role"] == "assistant"]


def test_the_copy_drill_asks_for_tokens_shown_earlier_in_the_row():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tb.SHIPPED_DIR)
    ids = set(tokenizer.convert_tokens_to_ids(list(ITEM_IDS)))
    rows = training_data.copy_drill_rows(tokenizer, 6, 12, seed=0)
    copied = 0
    for input_ids, labels in rows:
        targets = [
            (at, token) for at, (token, label) in enumerate(zip(input_ids, labels, strict=True)) if label != -100
        ]
        assert targets
        # Every id to write was shown before (random sequences: every token; search results: each item's id).
        for at, token in targets:
            if token in ids:
                assert token in input_ids[:at]
                copied += 1
    assert copied >= 6


def test_the_shipped_tokenizer_is_a_byte_level_bpe_with_every_item_id_one_token(shipped):
    tokenizer = shipped.tokenizer
    assert len(tokenizer) >= 2000
    assert tokenizer.backend_tokenizer.model.__class__.__name__ == "BPE"
    assert all(len(tokenizer(item_id, add_special_tokens=False)["input_ids"]) == 1 for item_id in ITEM_IDS[:50])
    text = "Grüße, 数字 🙂"  # bytes it never saw still round-trip
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_the_shipped_policy_solves_held_out_tasks_in_the_chat_format(shipped):
    from reward_models.rollout import rollout

    config = tb.ToolBootstrapConfig()  # evaluated at the shop's default difficulty, as the demo project runs it
    env = ToolShop(**config.env_config())
    tasks = [env.make_task(seed) for seed in list(env.eval_seeds())[:20]]
    episodes = rollout(lambda: ToolShop(**config.env_config()), tasks, shipped, greedy=True, seed=0)
    successes = sum(episode.success for episode in episodes)
    assert 2 <= successes < 20, f"{successes} of 20 held-out tasks solved"
    first = episodes[0].steps[0]
    assert first.text.startswith(TOOL_CALL_START) and TOOL_CALL_END in first.text
    call = parse_assistant_text(first.text)["tool_calls"][0]["function"]
    assert call["name"] == "search" and "query" in json.loads(call["arguments"])
    assert first.text == shipped.tokenizer.decode(first.token_ids, skip_special_tokens=True)


def test_the_bootstrap_copies_the_shipped_weights_only_for_their_training_settings():
    made_with = tb.shipped_config()
    assert made_with.training_fields() == tb.ToolBootstrapConfig().training_fields(), "the defaults made them"
    assert tb.uses_shipped(tb.ToolBootstrapConfig(output_dir="elsewhere", eval_tasks=5, num_threads=1))
    assert not tb.uses_shipped(tb.ToolBootstrapConfig(use_shipped=False))
    assert not tb.uses_shipped(replace(tb.ToolBootstrapConfig(), seed=1))
    assert not tb.uses_shipped(replace(tb.ToolBootstrapConfig(), max_train_steps=1000))
    assert not tb.uses_shipped(replace(tb.ToolBootstrapConfig(), train_difficulty=2))
    assert tb.uses_shipped(tb.ToolBootstrapConfig(difficulty=3)), "the difficulty it is evaluated at is not trained"


def test_a_short_bootstrap_trains_and_a_copy_evaluates_what_it_copied(tmp_path):
    trained = tb.main(
        tb.ToolBootstrapConfig(
            output_dir=str(tmp_path / "trained"),
            n_episodes=40,
            max_train_steps=6,
            copy_drill_steps=3,
            warmup_steps=2,
            eval_tasks=4,
            num_threads=1,
        )
    )
    assert trained["shipped"] is False and trained["train_steps"] == 6 and trained["drill_steps"] == 3
    assert trained["final_loss"] < trained["initial_loss"]
    assert (tmp_path / "trained" / "model.safetensors").is_file()

    copied = tb.main(tb.ToolBootstrapConfig(output_dir=str(tmp_path / "copied"), eval_tasks=4, num_threads=1))
    assert copied["shipped"] is True and copied["eval_tasks"] == 4
    shipped_bytes = (tb.SHIPPED_DIR / "model.safetensors").read_bytes()
    assert (tmp_path / "copied" / "model.safetensors").read_bytes() == shipped_bytes
    assert json.loads((tmp_path / "copied" / "metrics.json").read_text())["greedy_success"] == copied["greedy_success"]
