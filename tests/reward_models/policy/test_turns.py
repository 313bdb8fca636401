from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reward_models.envs import GridWorld  # noqa: E402
from reward_models.policy.bootstrap import vocabulary_corpus  # noqa: E402
from reward_models.policy.tokenizer import build_word_tokenizer  # noqa: E402
from reward_models.policy.turns import (  # noqa: E402
    Turn,
    encode_turn,
    encode_turns,
    format_decision,
    parse_decision,
    render_prompt,
    turn_messages,
)

OBSERVATION = ". A | G #"


@pytest.fixture(scope="module")
def tokenizer():
    return build_word_tokenizer(vocabulary_corpus(GridWorld()))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("goal is down 2 right 3 ; action right", ("goal is down 2 right 3", "right")),
        ("action up", ("", "up")),
        ("I think the goal is left.\nAction: left.", ("I think the goal is left.", "left")),
        ("The next action is unclear; Action = `down`", ("The next action is unclear", "down")),
        ("right", ("", "right")),
        ("goal goal ; ; 3", ("", "goal goal ; ; 3")),
        ("", ("", "")),
        ("goal is up 1 ; action", ("goal is up 1", "")),
    ],
)
def test_parse_decision_is_tolerant(text, expected):
    assert parse_decision(text) == expected


def test_format_and_parse_round_trip():
    assert parse_decision(format_decision("goal is up 1 left 0", "up")) == ("goal is up 1 left 0", "up")
    assert format_decision("", "left") == "action left"


def test_turn_messages_shows_the_history_window():
    history = [Turn("o1", "r1"), Turn("o2", "r2"), Turn("o3", "r3")]
    markov = turn_messages("reach", history, "o4", history_window=0)
    assert markov == [{"role": "system", "content": "reach"}, {"role": "user", "content": "o4"}]
    last_one = turn_messages("reach", history, "o4", history_window=1)
    assert [m["content"] for m in last_one] == ["reach", "o3", "r3", "o4"]
    everything = turn_messages("reach", history, "o4", history_window=None)
    assert [m["role"] for m in everything] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert turn_messages("reach", history, "o4", history_window=10) == everything
    with pytest.raises(ValueError, match="history_window"):
        turn_messages("reach", history, "o4", history_window=-1)


def test_tokenizer_is_a_small_word_level_vocabulary_that_round_trips(tokenizer):
    assert 25 <= len(tokenizer) <= 40
    text = "goal is down 2 right 3 ; action right"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.split())
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id in tokenizer("dance", add_special_tokens=False)["input_ids"]


def test_tokenizer_is_the_same_when_rebuilt(tokenizer):
    assert build_word_tokenizer(vocabulary_corpus(GridWorld())).get_vocab() == tokenizer.get_vocab()


def test_chat_template_renders_conversations_in_the_tiny_format(tokenizer):
    messages = turn_messages("reach the goal G", [Turn(OBSERVATION, "action up")], OBSERVATION, None)
    assert render_prompt(tokenizer, messages) == (
        "<bos><system> reach the goal G <user> . A | G # <assistant> action up <eos> <user> . A | G # <assistant>"
    )


def test_encode_turn_splits_prompt_from_completion_consistently_with_the_template(tokenizer):
    messages = turn_messages("reach the goal G", [], OBSERVATION, 0)
    completion = "goal is down 1 left 1 ; action down"
    encoding = encode_turn(tokenizer, messages, completion)
    whole = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": completion}], tokenize=False)
    whole_ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert encoding.prompt_ids + encoding.completion_ids == whole_ids
    assert encoding.completion_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(encoding.completion_ids, skip_special_tokens=True) == completion
    assert encode_turns(tokenizer, [messages, messages], [completion, completion]) == [encoding, encoding]


def test_prompt_falls_back_to_a_plain_transcript_without_a_chat_template(tokenizer):
    plain = build_word_tokenizer(vocabulary_corpus(GridWorld()))
    plain.chat_template = None
    prompt = render_prompt(plain, turn_messages("reach", [], OBSERVATION, 0))
    assert prompt == f"System: reach\nUser: {OBSERVATION}\nAssistant:"


def test_tokenizer_saves_and_loads_offline_with_its_chat_template(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    messages = turn_messages("reach the goal G", [], OBSERVATION, 0)
    assert render_prompt(loaded, messages) == render_prompt(tokenizer, messages)
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert (loaded.pad_token, loaded.eos_token, loaded.bos_token) == ("<pad>", "<eos>", "<bos>")


# --- chat models with tool calls --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer():
    from reward_models.policy.chat_format import build_bpe_tokenizer
    from tests.reward_models import tool_chat

    return build_bpe_tokenizer(tool_chat.tokenizer_corpus(), 512)


def test_a_tool_calls_field_is_encoded_as_the_model_writes_the_same_calls_in_its_text(chat_tokenizer):
    from tests.reward_models import tool_chat

    prompt = tool_chat.prompt(2)
    field = tool_chat.field_call("add", {"item_id": "k7", "quantity": 2})
    markup = tool_chat.markup_call("add", {"item_id": "k7", "quantity": 2})
    by_field = encode_turn(chat_tokenizer, prompt, field, tool_chat.TOOLS)
    assert by_field == encode_turn(chat_tokenizer, prompt, markup, tool_chat.TOOLS)
    assert chat_tokenizer.decode(by_field.prompt_ids) == render_prompt(chat_tokenizer, prompt, tool_chat.TOOLS)
    assert tool_chat.TOOLS_BLOCK in chat_tokenizer.decode(by_field.prompt_ids)
    assert chat_tokenizer.decode(by_field.completion_ids) == markup["content"] + "<|im_end|>"
    # A turn is what the template renders after the prompt it was given: nothing of it is cut or re-parsed.
    whole = chat_tokenizer.apply_chat_template([*prompt, field], tools=tool_chat.TOOLS, tokenize=False)
    assert whole == chat_tokenizer.decode(by_field.prompt_ids + by_field.completion_ids) + "\n"


def test_the_steps_of_a_conversation_end_at_each_assistant_turn_in_both_styles():
    from reward_models.policy.turns import message_steps, text_steps, transcript
    from tests.reward_models import tool_chat

    messages = tool_chat.trajectory(2, 2).messages
    prompt, pieces = message_steps(messages)
    assert prompt == messages[:2] and [piece[-1]["role"] for piece in pieces] == ["assistant"] * 3
    assert [message for piece in pieces for message in piece] == messages[2:-1]  # no step is judged on "thanks"
    text_prompt, text_pieces = text_steps(messages)
    assert text_prompt + "".join(text_pieces) == transcript(messages[:-1])
    assert text_pieces[0] == ' search({"query": "k7"})'  # a tool_calls field, as the transcript writes it
    assert text_pieces[1].startswith("\nTool: [search]") and "<tool_call>" in text_pieces[1]  # the text, verbatim


def test_the_actions_layout_keeps_a_turns_tool_calls_and_drops_its_reasoning():
    from reward_models.policy.turns import action_only
    from tests.reward_models import tool_chat

    markup = tool_chat.markup_call("add", {"item_id": "k7", "quantity": 2}, thought="the id is k7")
    assert action_only(markup)["content"] == tool_chat.markup_call("add", {"item_id": "k7", "quantity": 2})["content"]
    field = {**tool_chat.field_call("search", {"query": "k7"}), "content": "let me look"}
    assert action_only(field) == {**field, "content": ""}
    assert action_only({"role": "assistant", "content": "goal is up 1 ; action up"})["content"] == "action up"


def test_a_long_prompt_is_cut_from_the_left_keeping_the_system_turn_in_generation_and_in_training(tool_policy_dir):
    import torch

    from reward_models.finetune.turn_batches import episode_encodings
    from reward_models.policy import LocalCausalLMPolicy
    from reward_models.policy.local import generated_logprob
    from reward_models.policy.turns import cut_prompt, render_prompt
    from tests.reward_models import tool_chat

    episode = tool_chat.episode(3, 2)
    conversation = episode.conversation()
    policy = LocalCausalLMPolicy(tool_policy_dir, max_new_tokens=12)
    tokenizer = policy.tokenizer
    before_last = conversation.before_step(2)
    full = tokenizer(render_prompt(tokenizer, before_last, tool_chat.TOOLS), add_special_tokens=False)["input_ids"]
    system = tokenizer(
        tokenizer.apply_chat_template(before_last[:1], tools=tool_chat.TOOLS, tokenize=False), add_special_tokens=False
    )["input_ids"]
    budget = len(system) + 20
    assert len(full) > budget
    cut = cut_prompt(tokenizer, before_last, tool_chat.TOOLS, full, budget)
    assert len(cut) == budget and cut[: len(system)] == system and cut[len(system) :] == full[-20:]
    assert cut_prompt(tokenizer, before_last, tool_chat.TOOLS, full, len(full)) == full
    # Generation is given the cut prompt, and the trainers' encodings cut it alike: the log-probability a trainer
    # recomputes is the one generation reported.
    policy.max_prompt_tokens = budget
    decision = policy.act([before_last], tools=[tool_chat.TOOLS], greedy=False, seed=1)[0]
    rolled = tool_chat.episode(3, 2)
    rolled.steps = rolled.steps[:3]
    rolled.steps[2].token_ids = decision.token_ids
    encoding = episode_encodings(tokenizer, rolled, None, max_prompt_tokens=budget)[2]
    assert encoding.prompt_ids == cut
    with torch.no_grad():
        rescored = generated_logprob(policy.model, encoding.prompt_ids, encoding.completion_ids)
    assert float(rescored) == pytest.approx(decision.logprob, abs=1e-3)
