from __future__ import annotations

import json

import pytest
import torch

from reward_models.envs import GridWorld
from reward_models.policy import LocalCausalLMPolicy, Turn, encode_turn, load_policy, turn_messages
from reward_models.policy.local import generated_logprob
from reward_models.policy.model import POLICY_SETTINGS_FILE, read_policy_settings


def gridworld_conversations(count: int, history_lengths: list[int] | None = None) -> list[list[dict]]:
    """Conversations over different maps; with ``history_lengths`` each gets that many earlier turns, so prompt
    lengths differ and left padding is exercised."""
    env = GridWorld()
    conversations = []
    for index in range(count):
        task = env.make_task(index)
        observation = env.reset(task)
        history = []
        for _ in range(history_lengths[index] if history_lengths else 0):
            history.append(Turn(observation, "goal is up 1 left 1 ; action up"))
            observation = env.step("up").observation
        conversations.append(turn_messages(task["instruction"], history, observation, None))
    return conversations


def test_policy_directory_loads_offline_with_plain_auto_classes(policy_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir, local_files_only=True)
    assert (policy_dir / "model.safetensors").exists()
    assert model.config.model_type == "llama"
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 700_000
    assert tokenizer.chat_template and len(tokenizer) == model.config.vocab_size
    assert json.loads((policy_dir / POLICY_SETTINGS_FILE).read_text())["history_window"] == 0


def test_directories_without_tandem_settings_get_full_history(tmp_path):
    settings = read_policy_settings(tmp_path)
    assert settings["history_window"] is None and settings["max_new_tokens"] > 0


def test_trained_policy_writes_well_formed_turns(local_policy):
    decisions = local_policy.act(gridworld_conversations(16))
    assert len(decisions) == 16
    moves = [GridWorld().action_from_message(d.message) for d in decisions]
    assert sum(move in ("up", "down", "left", "right") for move in moves) >= 14
    # The message is the generated text, verbatim.
    assert all(d.message == {"role": "assistant", "content": d.text} for d in decisions)
    assert all(d.text.startswith("goal is") for d in decisions)
    assert all(d.logprob is not None and d.logprob <= 0 for d in decisions)


def test_batched_greedy_generation_equals_one_at_a_time_with_left_padding(local_policy):
    conversations = gridworld_conversations(6, history_lengths=[0, 3, 1, 0, 2, 5])
    prompt_lengths = {len(encode_turn(local_policy.tokenizer, c, "").prompt_ids) for c in conversations}
    assert len(prompt_lengths) > 1  # otherwise this would not test padding
    batched = local_policy.act(conversations)
    one_by_one = [local_policy.act([conversation])[0] for conversation in conversations]
    assert [d.text for d in batched] == [d.text for d in one_by_one]
    assert [d.logprob for d in batched] == pytest.approx([d.logprob for d in one_by_one], abs=1e-4)


def test_reported_logprob_is_the_models_logprob_of_the_encoded_completion(local_policy):
    # Trainers rescore turns through encode_turn; this ties that encoding to what generation produced.
    conversations = gridworld_conversations(4)
    for sampled in (False, True):
        decisions = local_policy.act(conversations, greedy=not sampled, temperature=1.5, seed=3)
        for conversation, decision in zip(conversations, decisions, strict=True):
            encoding = encode_turn(local_policy.tokenizer, conversation, decision.text)
            with torch.no_grad():
                rescored = generated_logprob(local_policy.model, encoding.prompt_ids, encoding.completion_ids)
            assert float(rescored) == pytest.approx(decision.logprob, abs=1e-3)


def test_prompts_read_in_chunks_give_the_same_decisions_as_read_whole(local_policy):
    conversations = gridworld_conversations(6, history_lengths=[0, 3, 1, 0, 2, 5])
    settings = {"history_window": local_policy.history_window, "max_new_tokens": local_policy.max_new_tokens}
    whole, chunked = (
        LocalCausalLMPolicy.from_model(local_policy.model, local_policy.tokenizer, prefill_tokens=tokens, **settings)
        for tokens in (100_000, 6 * 8)  # 8 positions of the 6 prompts at a time
    )
    for greedy in (True, False):
        expected, got = (policy.act(conversations, greedy=greedy, seed=2) for policy in (whole, chunked))
        assert [d.token_ids for d in got] == [d.token_ids for d in expected]
        assert [d.logprob for d in got] == pytest.approx([d.logprob for d in expected], abs=1e-4)


def test_a_checkpoints_own_sampling_settings_do_not_change_what_the_policy_samples_from(local_policy):
    # Checkpoints ship generation settings (Qwen: repetition penalty 1.05, top-k 20, temperature 0.7); the policy
    # must sample from, and report log-probabilities of, the model itself, which trainers then recompute.
    conversations = gridworld_conversations(4, history_lengths=[0, 2, 1, 3])
    plain = [local_policy.act(conversations, greedy=greedy, seed=5) for greedy in (True, False)]
    shipped = local_policy.model.generation_config
    local_policy.model.generation_config = shipped.__class__(
        **{**shipped.to_dict(), "repetition_penalty": 3.0, "no_repeat_ngram_size": 2, "top_k": 2, "top_p": 0.5}
    )
    try:
        configured = [local_policy.act(conversations, greedy=greedy, seed=5) for greedy in (True, False)]
    finally:
        local_policy.model.generation_config = shipped
    for before, after in zip(plain, configured, strict=True):
        assert [d.token_ids for d in after] == [d.token_ids for d in before]
        assert [d.logprob for d in after] == pytest.approx([d.logprob for d in before], abs=1e-4)


def test_sampling_is_reproducible_under_a_seed_and_leaves_global_rng_alone(local_policy):
    conversations = gridworld_conversations(24)
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    first = local_policy.act(conversations, greedy=False, temperature=2.0, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    again = local_policy.act(conversations, greedy=False, temperature=2.0, seed=5)
    other = local_policy.act(conversations, greedy=False, temperature=2.0, seed=6)
    assert [d.text for d in first] == [d.text for d in again]
    assert [d.text for d in first] != [d.text for d in other]


def test_batch_size_splits_generation_without_changing_greedy_output(policy_dir, local_policy):
    conversations = gridworld_conversations(10)
    small_batches = LocalCausalLMPolicy(policy_dir, batch_size=3)
    assert [d.text for d in small_batches.act(conversations)] == [d.text for d in local_policy.act(conversations)]


def test_load_policy_builds_a_local_policy_from_a_spec(policy_dir):
    policy = load_policy({"kind": "local", "path": str(policy_dir), "device": "cpu"})
    assert isinstance(policy, LocalCausalLMPolicy) and policy.history_window == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"kind": "hub"}, "'kind' must be"), ({"kind": "local"}, "needs a 'path'"), ({"kind": "endpoint"}, "base_url")],
)
def test_load_policy_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        load_policy(spec)


def test_local_policy_rejects_an_unknown_dtype(policy_dir):
    with pytest.raises(ValueError, match="dtype"):
        LocalCausalLMPolicy(policy_dir, dtype="int8")


def test_what_a_call_generates_does_not_hang_on_the_calls_before_it(policy_dir):
    policy = load_policy({"kind": "local", "path": str(policy_dir)})
    short = gridworld_conversations(6)
    first = [policy.act(short, greedy=greedy, seed=5) for greedy in (True, False)]
    policy.act(gridworld_conversations(6, [12] * 6))  # long prompts: a longer cache than the short call needs
    again = [policy.act(short, greedy=greedy, seed=5) for greedy in (True, False)]
    for before, after in zip(first, again, strict=True):
        assert [(d.token_ids, d.logprob) for d in after] == [(d.token_ids, d.logprob) for d in before]
