"""Nash-MD and SPO on multi-turn gridworld rollouts of a short-bootstrapped tiny policy, scored by a preference model
trained on oracle-labelled comparisons; the mixture policy, the win-rate reward and the observation mask."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from reward_models.common.artifacts import read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune.nash import NashConfig, main
from reward_models.finetune.nash_mixture import MixturePolicy, mixture_logprobs
from reward_models.finetune.nash_objectives import group_advantages, reinforce_kl_loss, reinforce_loss, win_rates
from reward_models.finetune.policy_model import load_policy_model
from reward_models.finetune.preference_model import PreferenceModelConfig
from reward_models.finetune.preference_model import main as train_preference_model
from reward_models.finetune.turn_batches import episode_encodings, pad_turns, token_logprobs
from reward_models.policy.local import LocalCausalLMPolicy
from reward_models.policy.model import save_policy
from reward_models.rollout import rollout
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows
from tests.launch import command_help, run_command
from tests.reward_models import tool_chat
from tests.reward_models.finetune.judges import trained_judge
from tests.reward_models.reporters import RecordingReporter, assert_finished_returns_summary, resumed_after_cancel

# Small runs: 3 tasks per iteration, 4 held-out tasks before and after.
TINY = {"batch_size": 3, "eval_tasks": 4, "learning_rate": 1e-3, "save_steps": 1000, "logging_steps": 1}
OBSERVATIONS = [". A . | . # G | . . .", "A . . | # # . | G . .", ". . G | . A . | . . ."]


@pytest.fixture(scope="module")
def preference_model_dir(tiny_base_model, tmp_path_factory) -> Path:
    """A preference model on the default 7x7 grid's comparisons, in the `decisions` layout (short sequences)."""
    work = tmp_path_factory.mktemp("nash-pm")
    rows = preference_rows(scripted_episodes(12, per_task=3, seed=0))
    settings = {"layout": "decisions", "max_steps": 8, "batch_size": 8, "learning_rate": 5e-3}
    return trained_judge(train_preference_model, PreferenceModelConfig, rows, work, "pm", tiny_base_model, **settings)


def make_config(policy_dir, preference_model_dir, output_dir, **overrides) -> NashConfig:
    return NashConfig(
        policy_path=str(policy_dir),
        preference_model_path=str(preference_model_dir),
        output_dir=str(output_dir),
        **{**TINY, **overrides},
    )


def conversations():
    """What a policy with a window of 0 is shown before acting: the instruction and the observation."""
    instruction = {"role": "system", "content": "reach the goal G"}
    return [[instruction, {"role": "user", "content": observation}] for observation in OBSERVATIONS]


# --- the mixture -------------------------------------------------------------------------------------------------


def test_mixture_logprobs_are_the_normalised_geometric_mixture_on_a_tensor_example():
    policy = torch.tensor([[0.5, 0.25, 0.25]]).log()
    reference = torch.tensor([[0.1, 0.1, 0.8]]).log()
    alpha = 0.5
    # sqrt(p * q) per token, then normalised: [sqrt(.05), sqrt(.025), sqrt(.2)] / their sum.
    unnormalised = torch.tensor([math.sqrt(0.05), math.sqrt(0.025), math.sqrt(0.2)])
    expected = unnormalised / unnormalised.sum()
    mixed = mixture_logprobs(policy + 3.0, reference - 1.0, alpha)  # logits: any shift is the same distribution
    assert torch.allclose(mixed.exp()[0], expected, atol=1e-6)
    assert mixed.exp().sum().item() == pytest.approx(1.0)
    assert torch.allclose(mixture_logprobs(policy, reference, 0.0).exp(), policy.exp(), atol=1e-6)
    assert torch.allclose(mixture_logprobs(policy, reference, 1.0).exp(), reference.exp(), atol=1e-6)


def test_the_mixture_policy_decodes_as_the_policy_at_alpha_0_and_the_reference_at_alpha_1(policy_dir, tiny_policy_dir):
    policy, reference = LocalCausalLMPolicy(policy_dir), LocalCausalLMPolicy(tiny_policy_dir)
    assert policy.tokenizer.get_vocab() == reference.tokenizer.get_vocab()
    for alpha, expected in ((0.0, policy), (1.0, reference)):
        mixture = MixturePolicy(
            policy.model, reference.model, policy.tokenizer, alpha, history_window=0, max_new_tokens=12
        )
        assert [d.text for d in mixture.act(conversations())] == [d.text for d in expected.act(conversations())]


def test_the_mixture_policy_samples_tokens_with_the_mixed_logprob_it_reports(policy_dir, tiny_policy_dir):
    """Recompute each sampled decision without KV caches: its logprob is the sum of the mixture's log-probabilities
    of its tokens, so the cached step-by-step decoding follows the mixture exactly."""
    policy, reference = LocalCausalLMPolicy(policy_dir), LocalCausalLMPolicy(tiny_policy_dir)
    mixture = MixturePolicy(policy.model, reference.model, policy.tokenizer, 0.4, history_window=0, max_new_tokens=12)
    decisions = mixture.act(conversations(), greedy=False, seed=3)
    for conversation, decision in zip(conversations(), decisions, strict=True):
        rendered = policy.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        prompt = mixture.prompt_batch([policy.tokenizer(rendered, add_special_tokens=False)["input_ids"]])
        ids = torch.cat([prompt["input_ids"][0], torch.tensor(decision.token_ids)])[None]
        with torch.no_grad():
            mixed = mixture_logprobs(policy.model(ids).logits, reference.model(ids).logits, 0.4)
        start = prompt["input_ids"].shape[1]
        targets = ids[0, start:]
        recomputed = mixed[0, start - 1 : -1].gather(-1, targets[:, None]).sum()
        assert decision.logprob == pytest.approx(float(recomputed), abs=1e-4)


# --- rewards and the loss ----------------------------------------------------------------------------------------


def test_win_rates_and_advantages_on_a_hand_example():
    matrix = [[0.5, 0.8, 0.6], [0.2, 0.5, 0.9], [0.4, 0.1, 0.5]]
    assert win_rates(matrix) == pytest.approx([0.7, 0.55, 0.25])
    assert sum(win_rates(matrix)) / 3 == pytest.approx(0.5)  # a symmetric model's rates average 1/2
    assert group_advantages([0.7, 0.55, 0.25]) == pytest.approx([0.2, 0.05, -0.25])
    scaled = group_advantages([0.7, 0.55, 0.25], scale=True)
    assert sum(value * value for value in scaled) / 3 == pytest.approx(1.0)
    assert group_advantages([0.5, 0.5], scale=True) == [0.0, 0.0]
    with pytest.raises(ValueError):
        win_rates([[0.5]])


def test_the_spo_loss_is_the_kl_free_part_of_the_nash_loss():
    logprobs = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]], requires_grad=True)
    coefficients = torch.tensor([0.25, -0.5])
    # - sum over tokens of advantage * log pi, over 4 episodes: -(0.25 * -3 + -0.5 * -0.5) / 4
    assert reinforce_loss(logprobs, coefficients, 4).item() == pytest.approx(0.125)
    same = reinforce_kl_loss(logprobs, logprobs.detach(), coefficients, 0.5, 4)  # log-ratio 0: no penalty
    assert same.item() == pytest.approx(0.125)


def test_observation_tokens_get_no_gradient_from_the_nash_loss(policy_dir):
    loaded = load_policy_model(policy_dir)
    policy = LocalCausalLMPolicy.from_model(loaded.model, loaded.tokenizer, history_window=0, max_new_tokens=12)
    from reward_models.envs.gridworld import GridWorld

    env = GridWorld()
    episodes = rollout(GridWorld, [env.make_task(s) for s in (1, 2)], policy, greedy=False, seed=1, render=False)
    encodings = [e for episode in episodes for e in episode_encodings(loaded.tokenizer, episode, 0)]
    batch = pad_turns(encodings, loaded.tokenizer.pad_token_id)
    logits = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    leaf = logits.detach().requires_grad_(True)
    logprobs = token_logprobs(loaded.model, batch, logits=leaf)
    reference = logprobs.detach() - 0.1  # a nonzero log-ratio, so the KL term has a gradient too
    coefficients = torch.linspace(-1.0, 1.0, len(encodings))
    reinforce_kl_loss(logprobs, reference, coefficients, 0.5, len(episodes)).backward()
    # Position t predicts token t + 1: only positions whose next token is a completion token may get gradient.
    predicts_completion = torch.nn.functional.pad(batch.completion_mask[:, 1:], (0, 1)).bool()
    assert leaf.grad[~predicts_completion].abs().max() == 0
    assert leaf.grad[predicts_completion].abs().sum() > 0


@pytest.mark.parametrize("with_reference", [False, True], ids=["spo", "nash_md"])
def test_the_update_scores_tokens_at_the_rollouts_sampling_temperature(
    with_reference, policy_dir, tiny_policy_dir, preference_model_dir, tmp_path
):
    """Rollouts drawn at temperature T come from softmax(logits / T): the update's log-probabilities, and the KL to
    the reference, are taken under that distribution, or the gradient is not the on-policy one."""
    from accelerate import Accelerator

    from reward_models.envs.gridworld import GridWorld
    from reward_models.finetune.nash import _update

    loaded = load_policy_model(policy_dir)
    reference = load_policy_model(tiny_policy_dir).model if with_reference else None
    policy = LocalCausalLMPolicy.from_model(loaded.model, loaded.tokenizer, history_window=0, max_new_tokens=12)
    env = GridWorld()
    tasks = [env.make_task(seed) for seed in (1, 2)]
    episodes = rollout(GridWorld, tasks, policy, greedy=False, temperature=2.0, seed=1, render=False)
    advantages = [0.75, -0.25]
    config = make_config(policy_dir, preference_model_dir, tmp_path, temperature=2.0, micro_batch_turns=64)
    settings = {"history_window": 0}
    pad_id = loaded.tokenizer.pad_token_id
    accelerator = Accelerator(cpu=True)
    tokenizer = loaded.tokenizer
    loss, kl, tokens = _update(
        accelerator, loaded.model, reference, tokenizer, settings, episodes, advantages, config, pad_id
    )

    encodings, owners = [], []
    for index, episode in enumerate(episodes):
        encodings += episode_encodings(loaded.tokenizer, episode, 0)
        owners += [index] * len(episode.steps)
    batch = pad_turns(encodings, pad_id, config.max_length)
    coefficients = torch.tensor(advantages)[owners]
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    with torch.no_grad():
        tempered = token_logprobs(loaded.model, batch, loaded.model(**inputs).logits / 2.0)
        plain = token_logprobs(loaded.model, batch)
        if reference is None:
            expected, at_one = (reinforce_loss(lp, coefficients, 2) for lp in (tempered, plain))
        else:
            ref_logits = reference(**inputs).logits
            ref_tempered = token_logprobs(reference, batch, ref_logits / 2.0)
            expected = reinforce_kl_loss(tempered, ref_tempered, coefficients, config.kl_beta, 2)
            at_one = reinforce_kl_loss(plain, token_logprobs(reference, batch), coefficients, config.kl_beta, 2)
            assert kl == pytest.approx(float((tempered - ref_tempered).sum()), rel=1e-4)
    assert tokens == int(batch.completion_mask.sum())
    assert abs(float(expected) - float(at_one)) > 1e-3, "the temperature changes the loss, so the check can tell"
    assert loss == pytest.approx(float(expected), rel=1e-4, abs=1e-6)


# --- the trainers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nash_run(policy_dir, preference_model_dir, tmp_path_factory):
    reporter = RecordingReporter()
    config = make_config(policy_dir, preference_model_dir, tmp_path_factory.mktemp("nash") / "run", max_steps=4)
    return config, main(config, reporter), reporter


def changed_weights(policy_dir: Path, output_dir: str) -> bool:
    from safetensors.torch import load_file

    before, after = (
        load_file(Path(policy_dir) / "model.safetensors"),
        load_file(Path(output_dir) / "model.safetensors"),
    )
    return any(not torch.equal(before[name], after[name]) for name in before)


def test_nash_md_trains_the_policy_with_finite_metrics_every_iteration(nash_run, policy_dir, preference_model_dir):
    config, summary, reporter = nash_run
    # 0 while the first iteration rolls out (its rollouts report after every turn), then one per iteration.
    assert [current for current, _ in reporter.steps] == [0, 1, 2, 3, 4]
    assert len(reporter.metrics) == 4
    for values in reporter.metrics:
        for name in ("loss", "kl", "preference", "train_success", "opponent_success", "completion_tokens"):
            assert math.isfinite(values[name]), name
        assert 0.0 <= values["preference"] <= 1.0
    kls = reporter.series("kl")
    assert kls[0] == pytest.approx(0.0, abs=1e-5)  # the first rollouts come from the reference itself
    assert any(abs(kl) > 1e-4 for kl in kls[1:])  # then the policy moves away from it
    assert len(set(reporter.series("loss"))) == 4
    assert changed_weights(policy_dir, config.output_dir)
    for side in ("base", "final"):
        assert set(summary["metrics"][side]) >= {"greedy_success", "greedy_stderr", "sampled_success", "tasks"}
    assert summary["labels_used"] == read_manifest(preference_model_dir)["summary"]["labels_used"] > 0
    assert summary["method"] == "nash_md" and summary["resumed_from"] is None
    # The result is an ordinary policy directory.
    assert len(LocalCausalLMPolicy(config.output_dir).act(conversations())) == 3


def test_spo_trains_on_k_sample_win_rates(policy_dir, preference_model_dir, tmp_path):
    reporter = RecordingReporter()
    config = make_config(
        policy_dir, preference_model_dir, tmp_path / "spo", method="spo", samples_per_task=3, max_steps=3
    )
    summary = main(config, reporter)
    assert [current for current, _ in reporter.steps] == [0, 1, 2, 3]
    for values in reporter.metrics:
        assert all(math.isfinite(value) for value in values.values())
        assert 0.0 <= values["win_rate_spread"] <= 0.5
    assert len(set(reporter.series("loss"))) == 3
    assert changed_weights(policy_dir, config.output_dir)
    assert summary["method"] == "spo"


def test_spo_optimises_win_rates_without_a_reference_or_kl_penalty(
    policy_dir, tiny_policy_dir, preference_model_dir, tmp_path
):
    """SPO is the paper's self-play: a run given a distant reference (an untrained policy) and a large kl_beta trains
    exactly as one with kl_beta 0."""
    runs = {}
    far = {"kl_beta": 1.0, "reference_path": str(tiny_policy_dir)}
    for name, overrides in (("plain", {"kl_beta": 0.0}), ("far", far)):
        reporter = RecordingReporter()
        config = make_config(
            policy_dir, preference_model_dir, tmp_path / name, method="spo", samples_per_task=2, max_steps=2,
            eval_tasks=0, **overrides,
        )  # fmt: skip
        main(config, reporter)
        runs[name] = reporter.metrics
    assert runs["far"] == runs["plain"]
    assert all("kl" not in values and math.isfinite(values["loss"]) for values in runs["plain"])
    from safetensors.torch import load_file

    plain, far = (load_file(tmp_path / name / "model.safetensors") for name in ("plain", "far"))
    assert all(torch.equal(plain[name], far[name]) for name in plain)
    assert changed_weights(policy_dir, str(tmp_path / "plain"))


@pytest.fixture(scope="module")
def dropout_policy_dir(tiny_policy_dir, tmp_path_factory) -> Path:
    """An untrained GPT-2-style policy with dropout 0.5 on its embeddings, attention and residual stream, and the tiny
    policy's word tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = load_policy_model(tiny_policy_dir).tokenizer
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=512, n_embd=32, n_layer=1, n_head=2,
        embd_pdrop=0.5, attn_pdrop=0.5, resid_pdrop=0.5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("gpt2"), history_window=0, max_new_tokens=12)


def test_the_update_scores_the_policy_that_played_with_dropout_off(dropout_policy_dir, preference_model_dir, tmp_path):
    """The loss's log-probabilities are those of the policy that sampled the episodes (dropout off): with dropout 0.5
    in every layer, the first iteration's KL to a frozen reference equal to the policy is exactly 0."""
    reporter = RecordingReporter()
    config = make_config(dropout_policy_dir, preference_model_dir, tmp_path / "run", max_steps=1, eval_tasks=0)
    main(config, reporter)
    [first] = reporter.metrics
    assert first["completion_tokens"] > 0
    assert first["kl"] == 0.0
    assert changed_weights(dropout_policy_dir, config.output_dir)


def test_a_cancelled_run_resumes_from_its_last_checkpoint_and_a_finished_one_returns_its_summary(
    policy_dir, preference_model_dir, tmp_path
):
    config = make_config(policy_dir, preference_model_dir, tmp_path / "run", max_steps=3, save_steps=1)
    summary, reporter = resumed_after_cancel(main, config, raise_at=2)
    assert summary["resumed_from"].endswith("step-2")
    assert [current for current, _ in reporter.steps] == [2, 3]  # only the third iteration ran again
    assert [entry["step"] for entry in summary["history"]] == [1, 2, 3]
    assert_finished_returns_summary(main, config, summary)


def test_bad_settings_name_the_field(policy_dir, preference_model_dir, tmp_path):
    base = {
        "policy_path": str(policy_dir),
        "preference_model_path": str(preference_model_dir),
        "output_dir": str(tmp_path),
    }
    for field_name, value in (("method", "dpo"), ("mixture_alpha", 1.5), ("samples_per_task", 1), ("kl_beta", -1)):
        with pytest.raises(ConfigError) as error:
            config_from_dict(NashConfig, {**base, field_name: value})
        assert error.value.field == field_name
    with pytest.raises(ConfigError) as error:
        config_from_dict(NashConfig, {**base, "preference_model_path": ""})
    assert error.value.field == "preference_model_path"


def test_command_line_help_and_a_tiny_run(policy_dir, preference_model_dir, tmp_path):
    help_text = command_help("reward_models.finetune.nash")
    assert "--mixture_alpha" in help_text and "--samples_per_task" in help_text
    flags = {"policy_path": policy_dir, "preference_model_path": preference_model_dir, "output_dir": tmp_path / "cli"}
    flags.update(method="spo", samples_per_task=2, batch_size=2, max_steps=1, eval_tasks=2)
    assert run_command("reward_models.finetune.nash", flags)["iterations"] == 1
    assert (tmp_path / "cli" / "tandem_artifact.json").is_file()


@pytest.fixture(scope="module")
def tool_preference_model_dir(tool_policy_dir, tmp_path_factory) -> Path:
    """A preference model on tool-calling trajectories, read through the chat template with their tools."""
    work = tmp_path_factory.mktemp("tool-pm")
    rows = tool_chat.preference_rows()
    return trained_judge(
        train_preference_model, PreferenceModelConfig, rows, work, "pm", tool_policy_dir, max_steps=2, batch_size=4
    )


@pytest.mark.parametrize("method", ["nash_md", "spo"])
def test_nash_and_spo_on_tool_calls_judge_the_preference_layout_with_the_tools(
    method, tool_policy_dir, tool_preference_model_dir, tmp_path
):
    from reward_models.finetune.nash_objectives import preference_pair
    from reward_models.finetune.preference_scoring import load_preference_model

    ours, theirs = tool_chat.episode(2, 2), tool_chat.episode(2, 3)
    prompt, a, b = preference_pair(ours, theirs)
    assert prompt == ours.prompt and a[0]["role"] == "assistant" and a[-1] == ours.steps[-1].replies[-1]
    preference = load_preference_model(tool_preference_model_dir, "cpu")
    assert tool_chat.TOOLS_BLOCK in preference.tokenizer.decode(preference.encode(prompt, a, ours.tools))
    assert preference.encode(prompt, a, None) != preference.encode(prompt, a, ours.tools)
    [p_ab], [p_ba] = (preference.probability([pair], [ours.tools]) for pair in ((prompt, a, b), (prompt, b, a)))
    assert 0 < p_ab < 1 and p_ba == pytest.approx(1 - p_ab)
    config = make_config(
        tool_policy_dir,
        tool_preference_model_dir,
        tmp_path / "run",
        method=method,
        **tool_chat.RUN_ENVIRONMENT,
        max_steps=1,
        batch_size=2,
        samples_per_task=2,
        eval_tasks=2,
    )
    summary = main(config, RecordingReporter())
    assert summary["iterations"] == 1 and math.isfinite(summary["history"][0]["loss"])
