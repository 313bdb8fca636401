"""Multi-turn PPO: rewards from a reward model and a PRM trained here in seconds, GAE from a value critic PPO keeps
training, the clipped loss on the policy's own tokens only, checkpoints and resume, on a tiny Llama on CPU."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from reward_models.common.config import ConfigError, config_from_dict
from reward_models.finetune.ppo import main, setup_run
from reward_models.finetune.ppo_config import PPOConfig
from reward_models.finetune.ppo_rewards import (
    reward_model_inputs,
)
from reward_models.finetune.turn_batches import episode_encodings, like_lengths, pad_turns, token_logprobs
from reward_models.rollout import episode_messages
from reward_models.value import load_value_critic
from simulation.episodes import scripted_episodes
from simulation.oracle_data import build_tiny_base, preference_rows, stepwise_rows
from tests.launch import command_help, flag_arguments, run_launched
from tests.reward_models import tool_chat
from tests.reward_models.finetune.judges import trained_judge
from tests.reward_models.finetune.ppo_episodes import EPISODE, EPISODE_OBSERVATIONS, EPISODE_TEXTS, grid_episode
from tests.reward_models.reporters import RecordingReporter, RunCancelled

# A 4x4 grid with a 6-step limit keeps episodes, and the critic's transcripts, short.
SMALL_GRID = {"size": 4, "max_steps": 6}
TINY = {
    "environment_config": SMALL_GRID,
    "max_steps": 4,
    "rollouts_per_step": 8,
    "batch_size": 16,
    "ppo_epochs": 2,
    "eval_tasks": 8,
    "selection_tasks": 4,
    "save_steps": 2,
    "logging_steps": 1,
    "learning_rate": 1e-3,
}


@pytest.fixture(scope="module")
def judges(tmp_path_factory) -> dict[str, Path]:
    """A reward model and a PRM, trained for a few steps on oracle-labelled rows of the small grid."""
    from reward_models.prm import PRMConfig
    from reward_models.prm import main as train_prm
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.train import main as train_reward_model

    folder = tmp_path_factory.mktemp("ppo-judges")
    base = build_tiny_base(folder / "base")
    episodes = scripted_episodes(30, per_task=3, seed=0, env_config=SMALL_GRID)
    fast = {"batch_size": 8, "learning_rate": 5e-3, "logging_steps": 5, "save_steps": 1000, "max_steps": 20}
    return {
        "reward_model_path": trained_judge(
            train_reward_model, RewardConfig, preference_rows(episodes), folder, "rm", base, **fast
        ),
        "prm_path": trained_judge(
            train_prm, PRMConfig, stepwise_rows(episodes), folder, "prm", base, max_length=512, **fast
        ),
    }


def make_config(policy: Path, output_dir: Path, judges: dict[str, Path] | None = None, **overrides) -> PPOConfig:
    paths = {name: str(path) for name, path in (judges or {}).items()}
    source = {"reward_source": "model", **paths} if judges else {"reward_source": "oracle"}
    return PPOConfig(policy_path=str(policy), output_dir=str(output_dir), **{**TINY, **source, **overrides})


@pytest.fixture(scope="module")
def trained(tiny_policy_dir, judges, tmp_path_factory):
    """One run with the reward model and the PRM: (config, summary, reporter)."""
    reporter = RecordingReporter()
    config = make_config(tiny_policy_dir, tmp_path_factory.mktemp("ppo") / "run", judges, prm_weight=1.0)
    return config, main(config, reporter), reporter


def test_the_prm_shaping_charges_bad_steps_and_never_pays_for_length(judges):
    from reward_models.finetune.ppo_rewards import JudgeRewards

    episodes = [EPISODE, grid_episode(EPISODE_OBSERVATIONS[:1], EPISODE_TEXTS[:1])]
    paths = (str(judges["reward_model_path"]), str(judges["prm_path"]))
    shared = {"prm_weight": 2.0, "layout": "full", "normalise": True, "device": "cpu"}
    alone, _ = JudgeRewards(paths[0], "", **shared)(episodes)

    def shaping(prm_shaping: str | None) -> tuple[list[float], dict[str, float]]:
        options = {} if prm_shaping is None else {"prm_shaping": prm_shaping}
        rewards, figures = JudgeRewards(*paths, **shared, **options)(episodes)
        pairs = zip(rewards, alone, strict=True)
        flat = [r - a for turns_r, turns_a in pairs for r, a in zip(turns_r, turns_a, strict=True)]
        return flat, figures

    signed, figures = shaping("signed")
    penalty, _ = shaping(None)  # the default
    centred, _ = shaping("centred")
    assert len(signed) == 4 and len({round(value, 6) for value in signed}) > 1
    # signed: weight x (P(good) - 0.5); penalty keeps only its charges, so no step earns anything.
    assert penalty == pytest.approx([min(value, 0.0) for value in signed])
    assert max(penalty) <= 0.0
    # centred: the first batch sets the baseline, the mean P(good) of its four steps, so it sums to zero over them,
    # and differs from signed by the same weight x (mean - 0.5) on every turn.
    assert sum(centred) == pytest.approx(0.0, abs=1e-6)
    assert signed == pytest.approx([value + 2.0 * (figures["prm_mean"] - 0.5) for value in centred])
    with pytest.raises(ConfigError, match="prm_shaping"):
        make_config(Path("."), Path("out"), prm_shaping="zero")
    # A PRM alone: its shaping is the whole reward, and the reward model's score is neither added nor logged.
    prm_alone, figures = JudgeRewards("", paths[1], **shared, prm_shaping="signed")(episodes)
    assert [reward for turns in prm_alone for reward in turns] == pytest.approx(signed)
    assert "reward_model_score" not in figures and "prm_mean" in figures
    with pytest.raises(ValueError, match="a reward model or a PRM"):
        JudgeRewards("", "", **shared)


def test_a_prm_alone_is_a_judge_but_not_with_the_penalty_shaping(judges, tmp_path):
    from reward_models.finetune.ppo_config import PPOConfig

    prm = str(judges["prm_path"])
    shared = {"policy_path": str(tmp_path), "output_dir": str(tmp_path / "out"), "reward_source": "model"}
    assert PPOConfig(**shared, prm_path=prm, prm_shaping="signed").reward_model_path == ""
    with pytest.raises(ConfigError, match="prm_shaping"):
        PPOConfig(**shared, prm_path=prm)


# --- training ----------------------------------------------------------------------------------------------------


def test_ppo_trains_the_policy_and_the_critic_and_logs_finite_figures(trained, tiny_policy_dir):
    config, summary, reporter = trained
    metrics = summary["metrics"]
    names = ("kl", "entropy", "clip_fraction", "approx_kl", "value_loss", "policy_loss", "mean_reward")
    names += ("success_rate", "reward_model_score", "prm_good_share", "invalid_share", "explained_variance", "kl_beta")
    logged = [values for values in reporter.metrics if "policy_loss" in values]
    assert [values["step"] for values in logged] == [1, 2, 3, 4]
    for values in logged:
        for name in names:
            assert name in values and math.isfinite(values[name]), name
    # Both losses move from iteration to iteration, and every update moves the policy.
    assert len(set(reporter.series("value_loss"))) == 4 and len(set(reporter.series("policy_loss"))) == 4
    assert min(reporter.series("approx_kl")) > 0
    assert reporter.series("kl")[-1] != 0
    assert [current for current, _ in reporter.steps][-1] == config.max_steps

    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_policy_dir)
    after = AutoModelForCausalLM.from_pretrained(config.output_dir)
    moved = [not torch.equal(a, b) for a, b in zip(before.parameters(), after.parameters(), strict=True)]
    # The result is the selected iteration's policy: the starting one when it scored best on the selection tasks.
    assert any(moved) == (metrics["selected_iteration"] != 0)
    for name in ("base", "final"):
        assert set(metrics[name]) >= {"greedy_success", "greedy_stderr", "sampled_success", "sampled_stderr"}
    assert summary["labels_used"] == 0 and summary["iterations"] == 4 and summary["resumed_from"] is None
    assert [record["iteration"] for record in metrics["selection"]] == [0, 2, 4]
    critic = load_value_critic(Path(config.output_dir) / "value_critic", device="cpu")
    [values] = critic.conversation_values([episode_messages(EPISODE)])
    assert len(values) == 3 and all(math.isfinite(v) for v in values)


def test_observation_tokens_get_no_gradient_in_the_ppo_update(tiny_policy_dir, judges, tmp_path):
    config = make_config(tiny_policy_dir, tmp_path / "run", judges, batch_size=12, entropy_coef=0.1)
    run = setup_run(config, RecordingReporter())
    run.state = {"kl_beta": config.kl_beta}
    batch = run.collect(run.rollouts(0))
    prompt_lengths = {tuple(e.prompt_ids + e.completion_ids): len(e.prompt_ids) for e in batch.encodings}
    inputs, logits = [], []

    def keep_inputs(module, args, kwargs):
        inputs.append((kwargs["input_ids"], kwargs["attention_mask"]))

    def keep_gradient(module, args, output):
        output.retain_grad()
        logits.append(output)

    hooks = [
        run.model.register_forward_pre_hook(keep_inputs, with_kwargs=True),
        run.policy.lm_head.register_forward_hook(keep_gradient),
    ]
    try:
        run.update(batch, 1)
    finally:
        for hook in hooks:
            hook.remove()
    # A forward pass per group of like length (at least one per minibatch).
    assert len(logits) >= config.ppo_epochs * math.ceil(len(batch.encodings) / config.batch_size)
    for (input_ids, attention_mask), output in zip(inputs, logits, strict=True):
        gradient = output.grad.abs().sum(-1)
        # The head ran on the last columns only: the logits at column t predict token t + 1, and only those
        # predicting a completion token may get a gradient.
        first = input_ids.shape[1] - gradient.shape[1]
        assert first > 0
        predicts_completion = torch.zeros_like(gradient, dtype=torch.bool)
        for row in range(input_ids.shape[0]):
            columns = attention_mask[row].nonzero().flatten().tolist()
            completion_start = columns[0] + prompt_lengths[tuple(input_ids[row, columns].tolist())]
            predicts_completion[row, completion_start - 1 - first : columns[-1] - first] = True
        assert gradient[~predicts_completion].max() == 0
        assert gradient[predicts_completion].gt(0).float().mean() > 0.5


def test_a_minibatch_taken_in_groups_of_like_length_steps_as_the_whole_minibatch_does(
    tiny_policy_dir, judges, tmp_path, monkeypatch
):
    import reward_models.finetune.ppo_run as ppo_run

    # One minibatch, one pass, no clipping and plain gradient descent: the step is the gradient itself.
    config = make_config(
        tiny_policy_dir, tmp_path / "run", judges, batch_size=512, ppo_epochs=1, entropy_coef=0.01, max_grad_norm=1e9
    )
    run = setup_run(config, RecordingReporter())
    run.state = {"kl_beta": config.kl_beta}
    batch = run.collect(run.rollouts(0))
    assert len(like_lengths(batch.encodings, range(len(batch.encodings)))) > 1
    start = {name: value.detach().clone() for name, value in run.model.named_parameters()}

    def step() -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            for name, value in run.model.named_parameters():
                value.copy_(start[name])
        run.policy_optimizer = torch.optim.SGD(run.model.parameters(), lr=1.0)
        figures = run.update(batch, 1)
        moved = torch.cat([(value.detach() - start[name]).flatten() for name, value in run.model.named_parameters()])
        return moved, figures

    grouped, grouped_figures = step()
    monkeypatch.setattr(ppo_run, "like_lengths", lambda encodings, indices, size=None: [list(indices)])
    whole, whole_figures = step()
    assert whole.abs().max() > 0
    assert torch.allclose(grouped, whole, rtol=1e-4, atol=1e-7)
    for name in ("policy_loss", "clip_fraction", "approx_kl"):
        assert grouped_figures[name] == pytest.approx(whole_figures[name], rel=1e-4, abs=1e-7)


def test_the_old_log_probabilities_are_each_turns_own_whatever_turns_are_batched_with_it(tiny_policy_dir, tmp_path):
    config = make_config(tiny_policy_dir, tmp_path / "run", batch_size=5)
    run = setup_run(config, RecordingReporter())
    run.state = {"kl_beta": config.kl_beta}
    episodes = run.rollouts(0)
    encodings = [
        turn
        for episode in episodes
        for turn in episode_encodings(run.tokenizer, episode, run.settings["history_window"])
    ]
    rows, _ = run.turn_logprobs(run.model, encodings)
    with torch.no_grad():
        for encoding, row in zip(encodings, rows, strict=True):
            alone = token_logprobs(run.model, pad_turns([encoding], run.tokenizer.pad_token_id))[0]
            assert torch.allclose(row, alone[-len(encoding.completion_ids) :], atol=1e-5)


def test_the_update_passes_run_without_dropout_so_the_first_ratio_is_one(tiny_policy_dir, tmp_path):
    # A checkpoint that trained with dropout keeps it in its config; PPO must switch it off in the policy it updates
    # and the critic it fits, or the update's log-probabilities are not those the rollouts sampled from.
    policy_dir = tmp_path / "with-dropout"
    shutil.copytree(tiny_policy_dir, policy_dir)
    settings = json.loads((policy_dir / "config.json").read_text())
    (policy_dir / "config.json").write_text(json.dumps({**settings, "attention_dropout": 0.5}))
    for use_lora in (False, True):
        run = setup_run(make_config(policy_dir, tmp_path / f"run-{use_lora}", use_lora=use_lora), RecordingReporter())
        run.model.train()
        run.critic.train()
        input_ids = torch.tensor([run.tokenizer("goal is down 1 left 1 ; action right")["input_ids"]])
        with torch.no_grad():
            policy = [run.model(input_ids=input_ids).logits for _ in range(2)]
            critic = [run.critic(input_ids=input_ids).logits for _ in range(2)]
        assert torch.equal(*policy) and torch.equal(*critic)
        assert run.model.training and run.critic.training


def test_the_critic_update_fits_the_returns_of_its_batch(tiny_policy_dir, judges, tmp_path):
    from reward_models.finetune.ppo_rewards import critic_forward

    config = make_config(tiny_policy_dir, tmp_path / "run", judges, ppo_epochs=4, critic_batch_size=4)
    run = setup_run(config, RecordingReporter())
    run.state = {"kl_beta": config.kl_beta}
    batch = run.collect(run.rollouts(0))
    targets = torch.tensor([g for returns in batch.returns for g in returns], device=run.accelerator.device)

    def error() -> float:
        with torch.no_grad():
            values = critic_forward(run.critic, batch.windows, run.critic_tokenizer.pad_token_id)
        return float(((values - targets) ** 2).mean())

    before = error()
    figures = run.update(batch, 1)
    assert error() < before
    assert math.isfinite(figures["value_loss"]) and figures["value_loss"] > 0


def test_a_cancelled_run_resumes_from_its_last_checkpoint_and_a_finished_one_returns_its_summary(
    tiny_policy_dir, judges, tmp_path
):
    config = make_config(tiny_policy_dir, tmp_path / "run", judges, max_steps=5)
    # Cancelled as iteration 3 ends, after the checkpoint of iteration 2.
    with pytest.raises(RunCancelled):
        main(config, RecordingReporter(raise_at=3))
    assert (tmp_path / "run" / "checkpoints" / "step-2").is_dir()
    assert not (tmp_path / "run" / "tandem_artifact.json").exists()
    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert summary["resumed_from"].endswith("step-2")
    assert any("resuming" in line for line in reporter.lines)
    iterations = sorted({values["step"] for values in reporter.metrics if "policy_loss" in values})
    assert iterations == [3, 4, 5]
    assert summary["iterations"] == 5
    # The base evaluation and the selection history came back from the checkpoint, not from a new start.
    assert [record["iteration"] for record in summary["metrics"]["selection"]] == [0, 2, 4, 5]
    assert not (tmp_path / "run" / "checkpoints").exists()

    again = RecordingReporter()
    assert main(config, again) == json.loads(json.dumps(summary))
    assert again.steps == [] and any("already holds" in line for line in again.lines)


def test_the_oracle_reward_trains_without_judges_and_without_selection(tiny_policy_dir, tmp_path):
    reporter = RecordingReporter()
    summary = main(make_config(tiny_policy_dir, tmp_path / "run", max_steps=2, selection_tasks=0), reporter)
    assert summary["metrics"]["selected_iteration"] == 2 and "last" not in summary["metrics"]
    # Evaluations and rollouts report their episodes in their own phases, between the iterations' own progress.
    phases = list(dict.fromkeys(phase for phase, _, _ in reporter.phases))
    assert phases == [
        "evaluating the base policy: greedy",
        "evaluating the base policy: sampled",
        "evaluating the trained policy: greedy",
        "evaluating the trained policy: sampled",
    ]
    # The rollouts report training's progress after every turn (the iterations finished so far), which the updates
    # then carry on: the bar counts iterations, and a cancel is seen at every turn.
    assert reporter.steps == [(0, 2), (1, 2), (2, 2)] and reporter.calls > 10
    # The environment's reward as it is: nothing judged, no format charge.
    assert "reward_model_score" not in reporter.metrics[0] and "invalid_share" not in reporter.metrics[0]
    assert all(math.isfinite(v) for v in reporter.series("value_loss"))


def test_a_cancel_stops_the_rollouts_of_an_iteration(tiny_policy_dir, tmp_path):
    # The first progress call with nothing finished is a rollout's first turn: the cancel raised there stops it.
    reporter = RecordingReporter(raise_at=0)
    config = make_config(tiny_policy_dir, tmp_path / "run", max_steps=2, selection_tasks=0, eval_tasks=0)
    with pytest.raises(RunCancelled):
        main(config, reporter)
    assert reporter.steps == [(0, 2)] and reporter.phases == [] and reporter.metrics == []


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"reward_source": "model"}, "reward_model_path"),
        ({"reward_source": "human"}, "reward_source"),
        ({"reward_source": "oracle", "reward_layout": "short"}, "reward_layout"),
        ({"reward_source": "oracle", "clip_range": 0}, "clip_range"),
        ({"reward_source": "oracle", "lam": 1.5}, "lam"),
        ({"reward_source": "oracle", "prm_path": "/no/such/prm"}, "prm_path"),
        ({"reward_source": "oracle", "ppo_epochs": 0}, "ppo_epochs"),
        ({"reward_source": "oracle", "invalid_penalty": -0.1}, "invalid_penalty"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(values, field, tiny_policy_dir):
    with pytest.raises(ConfigError) as error:
        config_from_dict(PPOConfig, {"policy_path": str(tiny_policy_dir), **values})
    assert error.value.field == field


def test_the_command_line_shows_help_and_trains_on_the_oracle_reward_across_two_processes(tiny_policy_dir, tmp_path):
    shown = command_help("reward_models.finetune.ppo")
    assert "--reward_model_path" in shown and "--kl_beta" in shown and "--prm_weight" in shown
    flags = {"policy_path": tiny_policy_dir, "output_dir": tmp_path / "cli", "reward_source": "oracle"}
    flags.update({**TINY, "max_steps": 2, "environment_config": json.dumps(SMALL_GRID)})
    done = run_launched("reward_models.finetune.ppo", flag_arguments(flags))
    summary = json.loads(done.stdout)
    assert summary["iterations"] == 2 and (tmp_path / "cli" / "tandem_artifact.json").is_file()
    # Each process rolled out half the tasks, and both trained on all of them.
    assert summary["episodes"] == 2 * TINY["rollouts_per_step"]
    assert "policy_loss=" in done.stderr


def test_ppo_on_tool_calls_renders_the_tools_scores_the_generated_tokens_and_judges_in_the_rows_layout(
    tool_policy_dir, tmp_path
):
    from reward_models.finetune.ppo_rewards import JudgeRewards, prm_messages
    from reward_models.prm import PRMConfig
    from reward_models.prm import main as train_prm
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.train import main as train_reward_model

    fast = {"batch_size": 4, "max_steps": 2, "save_steps": 1000}
    pairs, steps = tool_chat.preference_rows(), tool_chat.stepwise_rows()
    judges = {
        "reward_model_path": trained_judge(
            train_reward_model, RewardConfig, pairs, tmp_path, "rm", tool_policy_dir, **fast
        ),
        "prm_path": trained_judge(train_prm, PRMConfig, steps, tmp_path, "prm", tool_policy_dir, **fast),
    }
    config = make_config(
        tool_policy_dir,
        tmp_path / "run",
        judges,
        **tool_chat.RUN_ENVIRONMENT,
        rollouts_per_step=4,
        eval_tasks=2,
        selection_tasks=0,
        max_steps=1,
    )
    run = setup_run(config, RecordingReporter())
    run.state = {"kl_beta": config.kl_beta}
    episodes = run.rollouts(0)
    tokenizer = run.tokenizer
    batch = run.collect(episodes)
    generated = [step.token_ids for episode in episodes for step in episode.steps]
    assert [encoding.completion_ids for encoding in batch.encodings] == generated
    assert all(tool_chat.TOOLS_BLOCK in tokenizer.decode(encoding.prompt_ids) for encoding in batch.encodings)
    critic_text = run.critic_tokenizer.decode(batch.windows[0].input_ids)
    assert tool_chat.TOOLS_BLOCK in critic_text and critic_text.endswith("<|im_start|>assistant\n")
    # The judges read an episode as the rows they trained on read: the reward model the preference layout, the PRM
    # the stepwise layout, both through the chat template with the episode's tools.
    judge_rewards = JudgeRewards(
        str(judges["reward_model_path"]),
        str(judges["prm_path"]),
        prm_weight=1.0,
        layout="full",
        normalise=False,
        device="cpu",
    )
    episode = tool_chat.episode(2, 2)
    prompt, completion = reward_model_inputs(episode, "full")
    assert (prompt, completion) == (episode.prompt, episode_messages(episode)[len(episode.prompt) :])
    ids = judge_rewards.reward_model.encode(prompt, completion, episode.tools)
    assert tool_chat.TOOLS_BLOCK in judge_rewards.reward_model.tokenizer.decode(ids)
    rewards, _ = judge_rewards([episode])
    [direct] = judge_rewards.prm.conversation_scores([prm_messages(episode)], [tool_chat.TOOLS])
    score, _ = judge_rewards.reward_model.score([prompt], [completion], [tool_chat.TOOLS])
    expected = [min(p - 0.5, 0.0) for p in direct]
    expected[-1] += score[0]
    assert rewards[0] == pytest.approx(expected, abs=1e-5)
    summary = main(config, RecordingReporter())
    assert summary["iterations"] == 1
