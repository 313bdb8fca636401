"""The value critic: a regression head at step ends on discounted gridworld returns (or judge-model rewards), with
a tiny untrained Llama on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from reward_models.common.artifacts import read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.common.data import split_by_task
from reward_models.value import (
    ValueConfig,
    discounted_returns,
    evaluate,
    explained_variance,
    load_value_critic,
    main,
    step_rewards,
)
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows, returns_rows, stepwise_rows, write_jsonl
from tests.launch import command_help, run_command
from tests.reward_models.reporters import (
    RecordingReporter,
    assert_cancel_stops_training,
    assert_finished_returns_summary,
    train_recorded,
)

# A 4x4 grid with an 8-step limit keeps a trajectory near 200 tokens.
SMALL_GRID = {"size": 4, "max_steps": 8}
FAST = {"batch_size": 8, "learning_rate": 1e-2, "logging_steps": 1, "save_steps": 1000, "max_length": 512}
GAMMA = 0.9


@pytest.fixture(scope="module")
def episodes():
    return scripted_episodes(40, per_task=3, seed=0, env_config=SMALL_GRID)


@pytest.fixture(scope="module")
def rows(episodes) -> list[dict]:
    return returns_rows(episodes)


@pytest.fixture(scope="module")
def data_path(rows, tmp_path_factory) -> Path:
    return write_jsonl(rows, tmp_path_factory.mktemp("value-data") / "returns.jsonl")


@pytest.fixture(scope="module")
def unrewarded_path(episodes, tmp_path_factory) -> Path:
    return write_jsonl(
        returns_rows(episodes, with_rewards=False), tmp_path_factory.mktemp("value-data") / "null.jsonl"
    )


@pytest.fixture(scope="module")
def trained(data_path, tiny_base_model, tmp_path_factory):
    """One 100-step run: (config, summary, reporter)."""
    output_dir = tmp_path_factory.mktemp("value") / "model"
    return train_recorded(
        main, ValueConfig, data_path, tiny_base_model, output_dir, max_steps=100, gamma=GAMMA, **FAST
    )


def train_judges(episodes, base_model, folder: Path, style: str) -> tuple[Path, Path]:
    """A PRM and a reward model trained (two steps each) on stepwise and preference rows of `style`: (prm, rm)."""
    from reward_models.prm import PRMConfig
    from reward_models.prm import main as train_prm
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.train import main as train_reward_model

    stepwise = write_jsonl(stepwise_rows(episodes, style=style), folder / "stepwise.jsonl")
    train_prm(
        PRMConfig(data_path=str(stepwise), base_model=str(base_model), output_dir=str(folder / "prm"), max_steps=2)
    )
    pairs = write_jsonl(preference_rows(episodes, style=style), folder / "preference.jsonl")
    train_reward_model(
        RewardConfig(data_path=str(pairs), base_model=str(base_model), output_dir=str(folder / "rm"), max_steps=2)
    )
    return folder / "prm", folder / "rm"


@pytest.fixture(scope="module")
def text_judges(episodes, tiny_base_model, tmp_path_factory) -> tuple[Path, Path]:
    """Judges trained on text rows, which read the text returns export."""
    return train_judges(episodes, tiny_base_model, tmp_path_factory.mktemp("judges"), "text")


@pytest.fixture(scope="module")
def chat_judges(episodes, tiny_base_model, tmp_path_factory) -> tuple[Path, Path]:
    """Judges trained on conversational rows (the exports' default), which read conversations through their chat
    template."""
    return train_judges(episodes, tiny_base_model, tmp_path_factory.mktemp("judges"), "conversational")


def config_for(data_path, base_model, output_dir, **overrides) -> ValueConfig:
    values = {"gamma": GAMMA, **FAST, **overrides}
    return ValueConfig(data_path=str(data_path), base_model=str(base_model), output_dir=str(output_dir), **values)


def test_discounted_returns_sum_the_rewards_ahead():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, -1.0, 2.0], 1.0) == [2.0, 1.0, 2.0]
    assert discounted_returns([3.0], 0.0) == [3.0]


def test_explained_variance_and_the_step_mean_baseline():
    assert explained_variance([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]) == 1.0
    assert explained_variance([0.0, 1.0, 2.0], [5.0, 5.0, 5.0]) == 0.0
    assert explained_variance([1.0, 1.0], [0.0, 2.0]) is None
    # Training returns average 0.5 at step 0 and 1.0 at step 1; the baseline predicts exactly those.
    metrics = evaluate([[0.5, 1.0]], [[0.5, 1.0]], [[0.0, 1.0], [1.0, 1.0]])
    assert metrics["baseline_step_mean_mse"] == 0.0 and metrics["mse"] == 0.0
    assert metrics["explained_variance"] == 1.0 and metrics["baseline_step_mean_explained_variance"] == 1.0


def test_training_lowers_the_loss_changes_the_weights_and_reports_every_step(trained, tiny_base_model):
    import torch
    from safetensors.torch import load_file

    config, summary, reporter = trained
    assert reporter.steps == [(step, 100) for step in range(1, 101)]
    losses = reporter.series("loss")
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20 - 0.02
    base = load_file(Path(tiny_base_model) / "model.safetensors")
    tuned = load_file(Path(config.output_dir) / "model.safetensors")
    shared = [name for name in tuned if name in base]
    assert len(shared) > 10
    assert all(not torch.equal(base[name], tuned[name]) for name in shared)
    assert tuned["score.weight"].shape[0] == 1
    assert summary["global_step"] == 100 and summary["judged_trajectories"] == 0


def test_the_loaded_critic_explains_variance_of_the_training_returns(trained, rows):
    config, _, _ = trained
    critic = load_value_critic(config.output_dir, device="cpu")
    train_rows, _ = split_by_task(rows, config.eval_fraction, config.seed)
    values = critic.batch_values([(row["prompt"], row["completions"]) for row in train_rows])
    returns = [discounted_returns(row["rewards"], GAMMA) for row in train_rows]
    assert [len(v) for v in values] == [len(g) for g in returns]
    flat_returns = [g for trajectory in returns for g in trajectory]
    assert explained_variance(flat_returns, [v for trajectory in values for v in trajectory]) > 0.1


def test_the_loaded_critic_gives_the_held_out_figures_the_trained_one_reported(trained, rows):
    config, summary, reporter = trained
    critic = load_value_critic(config.output_dir)  # on the device that trained it (CUDA where there is one)
    train_rows, held_out = split_by_task(rows, config.eval_fraction, config.seed)
    values = [critic.values(row["prompt"], row["completions"]) for row in held_out]
    returns = [discounted_returns(row["rewards"], GAMMA) for row in held_out]
    recomputed = evaluate(values, returns, [discounted_returns(row["rewards"], GAMMA) for row in train_rows])
    metrics = summary["metrics"]
    assert {name: metrics[name] for name in recomputed} == pytest.approx(recomputed, abs=1e-5)
    assert metrics["held_out_trajectories"] == metrics["held_out_trajectories_with_rewards"] == len(held_out)
    assert "explained_variance" in metrics and "baseline_step_mean_explained_variance" in metrics
    assert read_manifest(config.output_dir)["metrics"] == metrics
    assert reporter.series("eval_mse") == [metrics["mse"]]


def test_rows_without_rewards_and_no_judge_are_refused_naming_reward_model(unrewarded_path, tiny_base_model, tmp_path):
    with pytest.raises(ConfigError) as caught:
        main(config_for(unrewarded_path, tiny_base_model, tmp_path / "model"))
    assert caught.value.field == "reward_model" and "no rewards" in str(caught.value)


def test_rows_without_rewards_take_step_rewards_from_the_prm_and_the_last_from_the_reward_model(
    episodes, text_judges, tiny_base_model, tmp_path
):
    from reward_models.prm import load_prm
    from reward_models.reward.model import load_reward_model

    prm_dir, reward_model_dir = text_judges
    rows = returns_rows(episodes[:6], with_rewards=False)
    config = config_for("x.jsonl", tiny_base_model, tmp_path, prm=str(prm_dir), reward_model=str(reward_model_dir))
    judged = step_rewards(rows, config, RecordingReporter())
    prm = load_prm(prm_dir, device="cpu")
    scores, _ = load_reward_model(reward_model_dir, device="cpu").score(
        [row["prompt"] for row in rows], ["".join(row["completions"]) for row in rows]
    )
    for row, rewards, score in zip(rows, judged, scores, strict=True):
        expected = [p - 0.5 for p in prm.step_scores(row["prompt"], row["completions"])]
        expected[-1] += score
        assert rewards == pytest.approx(expected, abs=1e-5)
    environment = returns_rows(episodes[:2])
    assert step_rewards(environment, config, RecordingReporter()) == [row["rewards"] for row in environment]


def test_conversational_returns_are_scored_through_the_chat_template_the_judges_trained_with(
    episodes, chat_judges, tiny_base_model, tmp_path
):
    from reward_models.prm import load_prm
    from reward_models.reward.encoding import encode
    from reward_models.reward.model import load_reward_model

    prm_dir, reward_model_dir = chat_judges
    rows = returns_rows(episodes[:6], with_rewards=False, style="conversational")
    config = config_for("x.jsonl", tiny_base_model, tmp_path, prm=str(prm_dir), reward_model=str(reward_model_dir))
    judged = step_rewards(rows, config, RecordingReporter())
    prm, reward_model = load_prm(prm_dir, device="cpu"), load_reward_model(reward_model_dir, device="cpu")
    completions = [[message for piece in row["completions"] for message in piece] for row in rows]
    scores, _ = reward_model.score([row["prompt"] for row in rows], completions)
    for row, rewards, score in zip(rows, judged, scores, strict=True):
        expected = [p - 0.5 for p in prm.step_scores(row["prompt"], row["completions"])]
        expected[-1] += score
        assert rewards == pytest.approx(expected, abs=1e-5)
    # What the reward model read is the conversation as its chat template renders it, not a transcript.
    tokens = reward_model.tokenizer.convert_ids_to_tokens(
        encode(reward_model.tokenizer, rows[0]["prompt"], completions[0])
    )
    assert tokens[:2] == ["<bos>", "<system>"] and "<assistant>" in tokens and "System:" not in tokens
    # Text rows cannot be rendered back into that template: refused, naming the judge.
    text_rows = returns_rows(episodes[:2], with_rewards=False)
    for name, judge in (("prm", prm_dir), ("reward_model", reward_model_dir)):
        only = config_for("x.jsonl", tiny_base_model, tmp_path, **{name: str(judge)})
        with pytest.raises(ConfigError) as caught:
            step_rewards(text_rows, only, RecordingReporter())
        assert caught.value.field == name and "conversational" in str(caught.value)


def test_conversational_returns_reach_the_judges_through_the_chat_template_with_their_tools(tool_policy_dir, tmp_path):
    from reward_models.prm import PRMConfig, load_prm
    from reward_models.prm import main as train_prm
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.model import load_reward_model
    from reward_models.reward.train import main as train_reward_model
    from tests.reward_models import tool_chat

    base, folder = str(tool_policy_dir), str(tmp_path)
    stepwise = write_jsonl(tool_chat.stepwise_rows(), tmp_path / "stepwise.jsonl")
    train_prm(PRMConfig(data_path=str(stepwise), base_model=base, output_dir=f"{folder}/prm", max_steps=2))
    pairs = write_jsonl(tool_chat.preference_rows(), tmp_path / "preference.jsonl")
    train_reward_model(RewardConfig(data_path=str(pairs), base_model=base, output_dir=f"{folder}/rm", max_steps=2))
    rows = [dict(row, rewards=None) for row in tool_chat.stepwise_rows(3)]
    config = config_for("x.jsonl", base, tmp_path, prm=f"{folder}/prm", reward_model=f"{folder}/rm")
    judged = step_rewards(rows, config, RecordingReporter())

    prm, reward_model = load_prm(f"{folder}/prm", device="cpu"), load_reward_model(f"{folder}/rm", device="cpu")
    prompts = [row["prompt"] for row in rows]
    completions = [[message for piece in row["completions"] for message in piece] for row in rows]
    tools = [row["tools"] for row in rows]
    scores, _ = reward_model.score(prompts, completions, tools)
    # The tools are part of what the judges read (the chat template writes them into the system turn).
    assert tool_chat.TOOLS_BLOCK in reward_model.tokenizer.decode(
        reward_model.encode(prompts[0], completions[0], tools[0])
    )
    assert reward_model.score(prompts, completions)[0] != pytest.approx(scores, abs=1e-6)
    trajectories = [(row["prompt"], row["completions"]) for row in rows]
    step_scores = prm.batch_step_scores(trajectories, tools)
    without_tools = prm.batch_step_scores(trajectories)
    assert [p for good in without_tools for p in good] != pytest.approx([p for good in step_scores for p in good])
    for rewards, good, score in zip(judged, step_scores, scores, strict=True):
        expected = [p - 0.5 for p in good]
        expected[-1] += score
        assert rewards == pytest.approx(expected, abs=1e-5)


def test_a_critic_trains_on_judge_returns_when_the_export_has_no_rewards(
    unrewarded_path, text_judges, tiny_base_model, tmp_path
):
    config = config_for(unrewarded_path, tiny_base_model, tmp_path / "model", max_steps=2, prm=str(text_judges[0]))
    summary = main(config)
    assert summary["judged_trajectories"] == summary["train_trajectories"] + summary["eval_samples"]
    assert summary["metrics"]["held_out_trajectories_with_rewards"] == 0
    assert len(load_value_critic(tmp_path / "model", device="cpu").values("System: reach the goal G", [" up"])) == 1


def test_a_critic_trains_on_conversational_returns_and_reads_episodes_as_it_trained(
    episodes, tiny_base_model, tmp_path
):
    data = write_jsonl(returns_rows(episodes, style="conversational"), tmp_path / "returns.jsonl")
    main(config_for(data, tiny_base_model, tmp_path / "model", max_steps=2))
    critic = load_value_critic(tmp_path / "model", device="cpu")
    assert critic.style == "conversational"
    row = returns_rows(episodes[:1], style="conversational")[0]
    values = critic.values(row["prompt"], row["completions"])
    assert critic.conversation_values([episodes[0].messages])[0] == pytest.approx(values, abs=1e-5)
    with pytest.raises(ValueError, match="conversational"):
        critic.values("System: reach the goal G", [" up"])


def test_a_run_resumes_from_its_last_checkpoint_after_a_crash(data_path, tiny_base_model, tmp_path):
    config = config_for(data_path, tiny_base_model, tmp_path / "model", max_steps=4, save_steps=2)
    with pytest.raises(RuntimeError, match="worker died"):
        main(config, RecordingReporter(raise_at=3, error=RuntimeError("worker died")))
    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert [step for step, _ in reporter.steps] == [3, 4]
    assert summary["global_step"] == 4


def test_a_cancel_raised_by_the_reporter_stops_training_within_one_step(data_path, tiny_base_model, tmp_path):
    assert_cancel_stops_training(main, config_for(data_path, tiny_base_model, tmp_path / "model", max_steps=50), 2)


def test_a_finished_run_directory_returns_its_summary_without_training(trained):
    config, summary, _ = trained
    assert_finished_returns_summary(main, config, summary)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"reward_model": 3}, "reward_model"),
        ({"batch_size": 0}, "batch_size"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"prm_path": "x"}, "prm_path"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(values, field):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(ValueConfig, {"data_path": "x.jsonl", "base_model": "base", **values})
    assert caught.value.field == field and str(caught.value).startswith(f"{field}:")


def test_a_judge_directory_that_does_not_exist_is_refused_naming_it(unrewarded_path, tiny_base_model, tmp_path):
    with pytest.raises(ConfigError, match="^prm: no such model directory"):
        main(config_for(unrewarded_path, tiny_base_model, tmp_path / "model", prm=str(tmp_path / "missing")))


def test_rows_whose_rewards_do_not_match_their_steps_are_refused_naming_the_data(rows, tiny_base_model, tmp_path):
    broken = [dict(rows[0], rewards=[1.0, *rows[0]["rewards"]]), *rows[1:]]
    with pytest.raises(ConfigError, match=r"data_path: 1 of \d+ rows cannot be used: row 1: rewards"):
        main(config_for(write_jsonl(broken, tmp_path / "rows.jsonl"), tiny_base_model, tmp_path / "model"))


def test_the_command_line_shows_help_and_trains_three_steps(data_path, tiny_base_model, tmp_path):
    shown = command_help("reward_models.value")
    assert "--gamma" in shown and "--reward_model" in shown and "--prm" in shown
    output_dir = tmp_path / "model"
    flags = {"data_path": data_path, "base_model": tiny_base_model, "output_dir": output_dir, "max_steps": 3}
    summary = run_command("reward_models.value", {**flags, "gamma": 0.5, "batch_size": 4})
    assert summary["global_step"] == 3 and "explained_variance" in summary["metrics"]
    assert read_manifest(output_dir)["config"]["gamma"] == 0.5
    assert len(load_value_critic(output_dir, device="cpu").values("System: reach the goal G", [" up", " down"])) == 2


def test_a_critic_on_tool_calls_reads_returns_through_the_chat_template_with_their_tools(tool_policy_dir, tmp_path):
    from transformers import AutoTokenizer

    from reward_models.policy.turns import message_steps
    from reward_models.steps import prepare_tokenizer, step_windows
    from tests.reward_models import tool_chat

    rows = []
    for index in range(6):
        quantity, added = 1 + index % 4, 1 + index % 4 + index % 2
        prompt, pieces = message_steps(tool_chat.trajectory(quantity, added).messages)
        rewards = [0.0, 0.0, float(added == quantity)]
        rows.append(
            {"prompt": prompt, "completions": pieces, "rewards": rewards, "task_id": index, "tools": tool_chat.TOOLS}
        )
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(tool_policy_dir))
    [window] = step_windows(tokenizer, rows[0]["prompt"], rows[0]["completions"], "", 1024, rows[0]["tools"])
    assert tool_chat.TOOLS_BLOCK in tokenizer.decode(window.input_ids)
    assert [tokenizer.decode([window.input_ids[p]]) for p in window.positions] == [
        "</tool_call>",
        "</tool_call>",
        "done",
    ]
    data = write_jsonl(rows, tmp_path / "returns.jsonl")
    summary = main(config_for(data, tool_policy_dir, tmp_path / "model", max_steps=2, eval_fraction=0.34))
    assert summary["global_step"] == 2 and "mse" in summary["metrics"]
    critic = load_value_critic(tmp_path / "model", device="cpu")
    values = critic.values(rows[0]["prompt"], rows[0]["completions"], rows[0]["tools"])
    [from_episode] = critic.conversation_values([tool_chat.trajectory(1, 1).messages], [tool_chat.TOOLS])
    assert from_episode == pytest.approx(values, abs=1e-6) and len(values) == 3
