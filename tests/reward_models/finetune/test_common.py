"""The shared pieces of the policy trainers: config checks, per-turn encodings, the observation mask, log-probs that
match what generation produced, evaluation, and accelerate checkpoints."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import TrainerControl

from reward_models.common.config import ConfigError, config_from_dict
from reward_models.common.runtime import fresh_accelerator
from reward_models.envs.gridworld import GridWorld
from reward_models.finetune.config import PolicyTrainConfig, train_seeds_tasks
from reward_models.finetune.evaluation import evaluate_policy, success_gain
from reward_models.finetune.loops import make_accelerator, out_of_time, resume_loop_checkpoint, save_loop_checkpoint
from reward_models.finetune.policy_model import load_policy_model
from reward_models.finetune.trl_runs import trainer_time_limit
from reward_models.finetune.turn_batches import (
    completion_logits,
    completion_logprobs,
    episode_encodings,
    pad_turns,
    prompt_steps,
    row_conversation,
    token_logprobs,
)
from reward_models.policy.local import LocalCausalLMPolicy
from reward_models.policy.turns import TurnEncoding, encode_conversation, encode_turn
from reward_models.rollout import Episode, Step, rollout
from tests.launch import run_launched
from tests.reward_models import tool_chat
from tests.reward_models.reporters import RecordingReporter, RunCancelled

CONVERSATION = [
    {"role": "system", "content": "reach the goal G"},
    {"role": "user", "content": ". A | G ."},
    {"role": "assistant", "content": "goal is down 1 left 1 ; action down"},
    {"role": "user", "content": ". . | G A"},
    {"role": "assistant", "content": "goal is down 0 left 1 ; action left"},
    {"role": "user", "content": ". . | A ."},
]


def test_an_exported_message_list_splits_into_steps_at_its_assistant_messages():
    conversation = row_conversation(CONVERSATION)
    assert conversation.prompt == CONVERSATION[:2]
    assert conversation.step_starts == [2, 4]
    # The last observation is the last step's reply; it is no turn of the policy's.
    assert conversation.through_step(1) == CONVERSATION
    assert prompt_steps(CONVERSATION[:3]) == 1


def test_encode_conversation_prompts_each_turn_as_the_policy_saw_it(policy_dir):
    loaded = load_policy_model(policy_dir)
    encodings = encode_conversation(loaded.tokenizer, row_conversation(CONVERSATION), None, history_window=1, start=1)
    # Shown one previous turn: the instruction, the first observation and decision, then the second observation.
    assert encodings == [encode_turn(loaded.tokenizer, CONVERSATION[:4], CONVERSATION[4])]
    # The observation of the second turn is in its prompt, and nowhere in its completion.
    observation_ids = loaded.tokenizer(CONVERSATION[3]["content"], add_special_tokens=False)["input_ids"]
    assert _contains(encodings[0].prompt_ids, observation_ids)
    assert not _contains(encodings[0].completion_ids, observation_ids)


def test_a_tool_calling_turn_is_prompted_with_its_tools_and_trained_on_its_own_tokens_only(tool_policy_dir):
    loaded = load_policy_model(tool_policy_dir)
    tokenizer = loaded.tokenizer
    conversation = tool_chat.trajectory(2, 2)
    encodings = encode_conversation(tokenizer, conversation, tool_chat.TOOLS, None)
    whole = tokenizer.apply_chat_template(conversation.messages, tools=tool_chat.TOOLS, tokenize=False)
    # Each completion is exactly the assistant's turn as the chat template renders it (a tool_calls field, or the
    # markup a local model wrote), closed by its end-of-turn token; tool results are only ever prompt tokens.
    spans = tool_chat.assistant_spans(tokenizer, whole)
    assert [tokenizer.decode(encoding.completion_ids) for encoding in encodings] == spans
    for encoding in encodings:
        assert tool_chat.TOOLS_BLOCK in tokenizer.decode(encoding.prompt_ids)
        assert "<tool_response>" not in tokenizer.decode(encoding.completion_ids)
    assert "<tool_response>" in tokenizer.decode(encodings[1].prompt_ids)
    batch = pad_turns(encodings, tokenizer.pad_token_id)
    trained = [
        tokenizer.decode(row[mask.bool()]) for row, mask in zip(batch.input_ids, batch.completion_mask, strict=True)
    ]
    assert trained == spans


def test_pad_turns_starts_every_completion_at_one_column_and_cuts_long_prompts_from_the_left():
    batch = pad_turns([TurnEncoding([1, 2, 3], [4, 5]), TurnEncoding([6], [7])], pad_token_id=0, max_length=4)
    assert batch.input_ids.tolist() == [[2, 3, 4, 5], [0, 6, 7, 0]]
    assert batch.completion_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 0]]
    # Each row counts its own tokens: the padding before a prompt takes no position.
    assert batch.position_ids[1, 1:3].tolist() == [0, 1] and batch.position_ids[0].tolist() == [0, 1, 2, 3]


def test_pad_turns_keeps_a_prompt_token_before_a_cut_completion_and_scores_no_token_without_one():
    # Cut to 3: the completion keeps 2 tokens and the prompt its last one, which predicts the first.
    batch = pad_turns([TurnEncoding([1, 2], [3, 4, 5, 6]), TurnEncoding([7], [8])], pad_token_id=0, max_length=3)
    assert batch.input_ids.tolist() == [[2, 3, 4], [7, 8, 0]]
    assert batch.completion_mask.tolist() == [[0, 1, 1], [0, 1, 0]]
    # A turn with no prompt at all: nothing comes before its first token, which is then not scored.
    batch = pad_turns([TurnEncoding([], [3, 4]), TurnEncoding([7], [8])], pad_token_id=0)
    assert batch.input_ids.tolist() == [[0, 3, 4], [7, 8, 0]]
    assert batch.completion_mask.tolist() == [[0, 0, 1], [0, 1, 0]]


def _scored_conversation(policy_dir):
    """The policy, the conversation's turns, their batch, and the model's logits at every column (no gradient)."""
    loaded = load_policy_model(policy_dir)
    encodings = encode_conversation(loaded.tokenizer, row_conversation(CONVERSATION), None, None)
    batch = pad_turns(encodings, loaded.tokenizer.pad_token_id)
    logits = loaded.model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits.detach()
    return loaded, encodings, batch, logits


def test_no_gradient_reaches_the_logits_of_observation_or_padding_positions(policy_dir):
    loaded, encodings, batch, logits = _scored_conversation(policy_dir)
    logits.requires_grad_(True)
    token_logprobs(loaded.model, batch, logits=logits).sum().backward()
    # The logit at position t predicts token t + 1: it gets a gradient exactly when token t + 1 is the policy's own.
    predicts_completion = torch.zeros_like(batch.completion_mask, dtype=torch.bool)
    predicts_completion[:, :-1] = batch.completion_mask[:, 1:].bool()
    has_gradient = logits.grad.abs().sum(dim=-1) > 0
    assert has_gradient[predicts_completion].all()
    assert not has_gradient[~predicts_completion].any()
    assert predicts_completion.sum() == sum(len(e.completion_ids) for e in encodings)


def test_token_logprobs_are_the_full_log_softmax_at_completion_tokens_and_zero_elsewhere(policy_dir):
    loaded, _, batch, logits = _scored_conversation(policy_dir)
    expected = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    expected = torch.nn.functional.pad(expected * batch.completion_mask[:, 1:], (1, 0))

    got = token_logprobs(loaded.model, batch, logits=logits)

    assert got.shape == batch.input_ids.shape
    assert torch.allclose(got, expected, atol=1e-5)
    assert (got[batch.completion_mask.bool()] <= 0).all() and (got[~batch.completion_mask.bool()] == 0).all()


def test_a_batch_of_turns_scores_each_completion_from_its_completion_columns_as_the_turn_alone_scores(policy_dir):
    loaded = load_policy_model(policy_dir)
    encodings = encode_conversation(loaded.tokenizer, row_conversation(CONVERSATION), None, None)
    encodings.append(TurnEncoding(encodings[0].prompt_ids[-3:], encodings[-1].completion_ids[:2]))
    alone = [token_logprobs(loaded.model, pad_turns([encoding], 0))[0] for encoding in encodings]

    batch = pad_turns(encodings, loaded.tokenizer.pad_token_id)
    logits, cut = completion_logits(loaded.model, batch)

    # Every completion starts at the same column, and the logits start one column before it.
    width = max(len(e.prompt_ids) for e in encodings)
    assert all(batch.completion_mask[row, width] == 1 for row in range(len(encodings)))
    assert logits.shape[1] == cut.input_ids.shape[1] == batch.input_ids.shape[1] - width + 1
    got = token_logprobs(loaded.model, cut, logits)
    for row, encoding in enumerate(encodings):
        expected = alone[row][-len(encoding.completion_ids) :]
        assert torch.allclose(got[row][cut.completion_mask[row].bool()], expected, atol=1e-5)
    assert torch.allclose(token_logprobs(loaded.model, batch)[:, -logits.shape[1] :], got)
    hot = completion_logits(loaded.model, batch, temperature=0.5)[0]
    assert torch.allclose(hot, logits / 0.5)


def test_completion_logprobs_match_the_logprobs_generation_reported(policy_dir):
    """What a trainer scores is exactly what the rollout generated: same prompt, same tokens, same probabilities."""
    loaded = load_policy_model(policy_dir)
    policy = LocalCausalLMPolicy.from_model(
        loaded.model, loaded.tokenizer, history_window=loaded.settings["history_window"], max_new_tokens=16
    )
    env = GridWorld()
    tasks = [env.make_task(seed) for seed in range(11, 19)]
    episodes = rollout(GridWorld, tasks, policy, greedy=False, seed=3, render=False, max_turns=3)
    encodings = [e for episode in episodes for e in episode_encodings(loaded.tokenizer, episode, 0)]
    reported = [step.logprob for episode in episodes for step in episode.steps]
    loaded.tokenizer.padding_side = "right"
    batch = pad_turns(encodings, loaded.tokenizer.pad_token_id)
    with torch.no_grad():
        scored = completion_logprobs(loaded.model, batch)
    assert scored.tolist() == pytest.approx(reported, abs=1e-3)


def test_episode_encodings_keep_the_generated_tokens_where_the_text_would_not_give_them_back(policy_dir):
    loaded = load_policy_model(policy_dir)
    tokenizer = loaded.tokenizer
    # A completion with a special token inside: decoding drops it, so re-encoding the text loses it.
    generated = tokenizer.convert_tokens_to_ids(["goal", "is", tokenizer.pad_token, "left", ";", "action", "left"])
    generated.append(tokenizer.eos_token_id)
    text = tokenizer.decode(generated, skip_special_tokens=True)
    message = {"role": "assistant", "content": text}
    replies = [{"role": "user", "content": ". A | . ."}]
    step = Step(". A | G .", message, replies, "", "left", text, reward=0.0, done=True, token_ids=generated)
    episode = Episode(
        task={"instruction": "reach the goal G"},
        sample_index=0,
        steps=[step],
        final_observation="",
        total_reward=0.0,
        success=False,
        truncated=False,
        prompt=CONVERSATION[:2],
    )
    [encoding] = episode_encodings(tokenizer, episode, 0)
    assert encoding.completion_ids == generated
    [from_text] = encode_conversation(tokenizer, episode.conversation(), None, 0)
    assert from_text.prompt_ids == encoding.prompt_ids and from_text.completion_ids != generated


def test_evaluate_policy_reports_greedy_and_sampled_success_on_held_out_tasks(policy_dir, tmp_path):
    config = PolicyTrainConfig(policy_path=str(policy_dir), output_dir=str(tmp_path), eval_tasks=3)
    loaded = load_policy_model(policy_dir)
    loaded.tokenizer.padding_side = "right"
    result = evaluate_policy(loaded.model, loaded.tokenizer, loaded.settings, config, seed=1, per_task=True)
    assert result["tasks"] == 3
    for mode in ("greedy", "sampled"):
        assert 0.0 <= result[f"{mode}_success"] <= 1.0
        assert result[f"{mode}_stderr"] >= 0.0
        assert sum(result[f"{mode}_per_task"]) / 3 == pytest.approx(result[f"{mode}_success"])
    one = PolicyTrainConfig(policy_path=str(policy_dir), output_dir=str(tmp_path), eval_tasks=1)
    assert "greedy_per_task" not in evaluate_policy(loaded.model, loaded.tokenizer, loaded.settings, one, seed=1)
    assert loaded.tokenizer.padding_side == "right"  # restored after generation padded on the left


def test_an_evaluation_reports_its_episodes_in_its_own_phase_and_a_cancel_stops_it(policy_dir, tmp_path):
    config = PolicyTrainConfig(policy_path=str(policy_dir), output_dir=str(tmp_path), eval_tasks=3, eval_samples=2)
    loaded = load_policy_model(policy_dir)
    reporter = RecordingReporter()
    evaluate_policy(
        loaded.model, loaded.tokenizer, loaded.settings, config, reporter=reporter, whose="the base policy"
    )
    greedy = [(done, total) for phase, done, total in reporter.phases if phase == "evaluating the base policy: greedy"]
    sampled = [
        (done, total) for phase, done, total in reporter.phases if phase == "evaluating the base policy: sampled"
    ]
    assert greedy[-1] == (3, 3) and sampled[-1] == (6, 6)
    assert len(greedy) > 1 and [done for done, _ in greedy] == sorted(done for done, _ in greedy)
    assert len(reporter.phases) == len(greedy) + len(sampled) and reporter.steps == []  # no training progress

    # A run cancelled mid-evaluation stops at the next turn, not after the whole evaluation.
    cancelling = RecordingReporter(raise_in="evaluating the trained policy: greedy")
    with pytest.raises(RunCancelled):
        evaluate_policy(loaded.model, loaded.tokenizer, loaded.settings, config, reporter=cancelling)
    assert len(cancelling.phases) == 1 and cancelling.phases[0][1] < 3


def test_several_sampled_episodes_per_held_out_task_give_fractional_task_rates(policy_dir, tmp_path, monkeypatch):
    from reward_models import rollout

    episodes = {}
    evaluate_success = rollout.evaluate_success

    def counting(*args, greedy, **kwargs):
        figures = evaluate_success(*args, greedy=greedy, **kwargs)
        episodes["greedy" if greedy else "sampled"] = figures["episodes"]
        return figures

    monkeypatch.setattr(rollout, "evaluate_success", counting)
    config = PolicyTrainConfig(policy_path=str(policy_dir), output_dir=str(tmp_path), eval_tasks=3, eval_samples=3)
    loaded = load_policy_model(policy_dir)
    result = evaluate_policy(loaded.model, loaded.tokenizer, loaded.settings, config, seed=2, per_task=True)
    assert episodes == {"greedy": 3, "sampled": 9}
    assert len(result["sampled_per_task"]) == len(result["greedy_per_task"]) == 3
    assert all(rate in (0.0, 1 / 3, 2 / 3, 1.0) for rate in result["sampled_per_task"])
    assert all(rate in (0.0, 1.0) for rate in result["greedy_per_task"])  # greedy is one deterministic episode
    with pytest.raises(ConfigError, match="^eval_samples: must be positive"):
        PolicyTrainConfig(policy_path=str(policy_dir), output_dir=str(tmp_path), eval_samples=0)


def test_the_gain_has_a_paired_standard_error_when_both_evaluations_kept_each_tasks_success():
    base = {"greedy_success": 0.5, "greedy_per_task": [0, 1, 0, 1], "sampled_success": 0.25}
    final = {"greedy_success": 0.75, "greedy_per_task": [1, 1, 0, 1], "sampled_success": 0.5}
    gains = success_gain({"base": base, "final": final})
    # The differences are [1, 0, 0, 0]: mean 0.25, sample variance 0.25, standard error sqrt(0.25 / 4).
    assert gains == pytest.approx({"greedy_gain": 0.25, "greedy_gain_stderr": 0.25, "sampled_gain": 0.25})
    final["greedy_per_task"] = [1, 1, 0]  # other tasks: no pairing, no error
    assert "greedy_gain_stderr" not in success_gain({"base": base, "final": final})
    assert success_gain({"base": {}, "final": final}) == {}


def test_training_tasks_never_include_held_out_ones(tmp_path, policy_dir):
    config = PolicyTrainConfig(policy_path=str(policy_dir), output_dir=str(tmp_path), eval_tasks=0)
    held_out = GridWorld().eval_seeds()
    seeds = [task["seed"] for task in train_seeds_tasks(config, 50, start=held_out.start - 10)]
    assert len(seeds) == 50 and not set(seeds) & set(held_out)


def test_a_config_names_the_bad_field(tmp_path):
    with pytest.raises(ConfigError, match="^environment: .*cannot import"):
        PolicyTrainConfig(policy_path="p", output_dir=str(tmp_path), environment="no.such.Env")
    with pytest.raises(ConfigError, match="^environment_config: must be an object"):
        config_from_dict(PolicyTrainConfig, {"policy_path": "p", "environment_config": [1]})
    with pytest.raises(ConfigError, match="^policy_path: .*no config.json"):
        load_policy_model(tmp_path)
    config = config_from_dict(PolicyTrainConfig, {"policy_path": "p", "environment_config": {"size": 5}})
    assert config.environment_config == {"size": 5}


def test_a_run_after_one_of_another_precision_in_the_same_process_gets_its_own_accelerator():
    """A worker process runs one training after another; accelerate refuses a second precision in one process
    (this failed the preference model after a bf16 run on a GPU)."""
    from accelerate.state import AcceleratorState

    try:
        fresh_accelerator("bf16")  # what an earlier bf16 run leaves in the process
        accelerator = make_accelerator(PolicyTrainConfig(policy_path="p", output_dir="o", precision="fp32"))
        assert accelerator.mixed_precision == "no"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_a_loop_checkpoint_restores_weights_optimiser_and_state(tmp_path, tiny_policy_dir):
    config = PolicyTrainConfig(policy_path=str(tiny_policy_dir), output_dir=str(tmp_path), eval_tasks=0)

    def prepared():
        accelerator = make_accelerator(config)
        model = load_policy_model(tiny_policy_dir).model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return accelerator, *accelerator.prepare(model, optimizer)

    accelerator, model, optimizer = prepared()
    ids = torch.tensor([[1, 2, 3, 4]], device=accelerator.device)
    for step in (1, 2, 3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        save_loop_checkpoint(accelerator, config, step, {"history": [step]})
    trained = {name: value.clone() for name, value in model.state_dict().items()}

    accelerator, model, optimizer = prepared()
    step, state, path = resume_loop_checkpoint(accelerator, config)
    assert (step, state, path.name) == (3, {"history": [3]}, "step-3")
    assert all(torch.equal(value, trained[name]) for name, value in model.state_dict().items())
    assert optimizer.state_dict()["state"]  # Adam's moments came back too
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-2", "step-3"]  # the last two are kept


def test_a_loop_checkpoint_across_two_processes_waits_for_the_slower_one(tmp_path):
    """Each process writes its own RNG state into the checkpoint; the first must not move the folder into place
    before the second has written (CI once failed a two-process PPO run this way)."""
    run_launched("tests.reward_models.finetune.slow_rank_checkpoint", [str(tmp_path)])
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == ["step-1", "step-2"]


def test_a_run_without_checkpoints_starts_at_step_zero(tmp_path, tiny_policy_dir):
    config = PolicyTrainConfig(policy_path=str(tiny_policy_dir), output_dir=str(tmp_path), eval_tasks=0)
    assert resume_loop_checkpoint(make_accelerator(config), config) == (0, {}, None)


def _contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i : i + len(part)] == part for i in range(len(sequence) - len(part) + 1))


def test_max_seconds_stops_a_loop_and_a_trainer_once_the_time_is_up(tmp_path):
    config = PolicyTrainConfig(policy_path="p", output_dir=str(tmp_path), max_seconds=60.0)
    now = time.monotonic()
    assert not out_of_time(config, now) and out_of_time(config, now - 61.0)
    assert not out_of_time(PolicyTrainConfig(policy_path="p", output_dir=str(tmp_path)), now - 1e6)  # 0: no limit
    callback, control = trainer_time_limit(config, now - 61.0), TrainerControl()
    callback.on_step_end(None, None, control)
    assert control.should_training_stop
    control = TrainerControl()
    trainer_time_limit(config, now).on_step_end(None, None, control)
    assert not control.should_training_stop


def test_a_policy_is_named_by_its_directory_or_by_a_hub_id_read_from_the_local_cache(
    tiny_policy_dir, tmp_path, monkeypatch
):
    from reward_models.common.judge_config import model_directory
    from tests.reward_models.conftest import in_hub_cache

    snapshot = in_hub_cache(tiny_policy_dir, "tandem-test/tiny", tmp_path / "hub", monkeypatch)

    assert model_directory(tiny_policy_dir, "policy_path") == tiny_policy_dir
    assert model_directory("tandem-test/tiny", "policy_path") == snapshot
    loaded = load_policy_model("tandem-test/tiny")
    assert loaded.model.config.hidden_size == load_policy_model(tiny_policy_dir).model.config.hidden_size
    with pytest.raises(ConfigError) as missing:
        model_directory("tandem-test/not-cached", "policy_path")
    assert missing.value.field == "policy_path" and "huggingface-cli download tandem-test/not-cached" in str(
        missing.value
    )
    with pytest.raises(ConfigError, match="is not a model directory: it has no config.json"):
        model_directory(tmp_path, "base_model")


def test_under_lora_the_frozen_base_is_kept_in_the_training_precision_and_the_adapters_in_fp32(tiny_policy_dir):
    full = load_policy_model(tiny_policy_dir, precision="bf16")
    assert {p.dtype for p in full.model.parameters()} == {torch.float32}  # what the optimiser updates stays fp32
    lora = load_policy_model(tiny_policy_dir, use_lora=True, precision="bf16")
    frozen = {p.dtype for p in lora.model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in lora.model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    input_ids = torch.tensor([lora.tokenizer("goal is up 1 ; action up")["input_ids"]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lora.model(input_ids=input_ids).logits
        with lora.model.disable_adapter():
            reference = lora.model(input_ids=input_ids).logits
    # LoRA starts as the identity: its reference (the adapters off) computes exactly as the policy.
    assert torch.isfinite(logits).all() and torch.equal(logits, reference)
    (logits.float().logsumexp(-1).sum()).backward()
    adapters = [p for name, p in lora.model.named_parameters() if "lora_B" in name]
    assert adapters and all(p.grad is not None and p.grad.dtype == torch.float32 for p in adapters)
