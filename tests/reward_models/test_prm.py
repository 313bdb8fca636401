"""The process reward model: token classification at step ends on oracle-labelled gridworld steps, with a tiny
untrained Llama on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from reward_models.common.artifacts import read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.common.data import split_by_task
from reward_models.prm import PRMConfig, bad_step_auroc, evaluate, first_error, load_prm, main, step_metrics
from reward_models.steps import IGNORE, prepare_tokenizer, step_windows, training_examples
from simulation.episodes import scripted_episodes
from simulation.oracle_data import intervention_rows, stepwise_rows, write_jsonl
from tests.launch import command_help, run_command
from tests.reward_models import tool_chat
from tests.reward_models.reporters import (
    RecordingReporter,
    assert_cancel_stops_training,
    assert_finished_returns_summary,
    train_recorded,
)

# A 4x4 grid with an 8-step limit keeps a trajectory near 200 tokens.
SMALL_GRID = {"size": 4, "max_steps": 8}
# Settings under which the tiny model separates good from bad steps within 200 steps (about 12 s on one thread).
# It learns in a sudden drop of the loss; at 1e-2 that came at step ~140 on a CPU but ~250 on an H100 (fp32 and
# bf16 alike), so the test failed there. At 5e-3 the margin below was 0.55 on a CPU, 0.58 (fp32) and 0.43 (bf16)
# on the H100.
PROMPT = [{"role": "system", "content": "reach the goal G"}, {"role": "user", "content": "A . G"}]
ACTION_UP = {"role": "assistant", "content": "action up"}
FAST = {"batch_size": 8, "learning_rate": 5e-3, "logging_steps": 1, "save_steps": 1000, "max_length": 512}


@pytest.fixture(scope="module")
def episodes():
    return scripted_episodes(40, per_task=3, seed=0, env_config=SMALL_GRID)


@pytest.fixture(scope="module")
def rows(episodes) -> list[dict]:
    return stepwise_rows(episodes) + intervention_rows(episodes)


@pytest.fixture(scope="module")
def data_path(rows, tmp_path_factory) -> Path:
    return write_jsonl(rows, tmp_path_factory.mktemp("prm-data") / "stepwise.jsonl")


@pytest.fixture(scope="module")
def tokenizer(tiny_base_model):
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_base_model))


@pytest.fixture(scope="module")
def trained(data_path, tiny_base_model, tmp_path_factory):
    """One 200-step run: (config, summary, reporter)."""
    output_dir = tmp_path_factory.mktemp("prm") / "model"
    return train_recorded(main, PRMConfig, data_path, tiny_base_model, output_dir, max_steps=200, **FAST)


def config_for(data_path, base_model, output_dir, **overrides) -> PRMConfig:
    return PRMConfig(
        data_path=str(data_path), base_model=str(base_model), output_dir=str(output_dir), **{**FAST, **overrides}
    )


def test_training_lowers_the_loss_changes_the_weights_and_reports_every_step(trained, tiny_base_model):
    import torch
    from safetensors.torch import load_file

    config, summary, reporter = trained
    assert reporter.steps == [(step, 200) for step in range(1, 201)]
    losses = reporter.series("loss")
    assert len(losses) == 200
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20 - 0.05
    base = load_file(Path(tiny_base_model) / "model.safetensors")
    tuned = load_file(Path(config.output_dir) / "model.safetensors")
    shared = [name for name in tuned if name in base]
    assert len(shared) > 10
    assert all(not torch.equal(base[name], tuned[name]) for name in shared)
    assert tuned["score.weight"].shape[0] == 2
    assert summary["global_step"] == 200 and summary["resumed_from"] is None
    assert summary["samples_per_second"] > 0 and summary["train_seconds"] > 0


def test_the_loaded_prm_gives_the_held_out_figures_the_trained_one_reported(trained, rows):
    config, summary, _ = trained
    prm = load_prm(config.output_dir, device="cpu")
    train_rows, held_out = split_by_task(rows, config.eval_fraction, config.seed)
    held_out = [row for row in held_out if row["source"] == "label"]
    scores = [prm.step_scores(row["prompt"], row["completions"]) for row in held_out]
    assert all(
        len(s) == len(row["completions"]) and all(0 < p < 1 for p in s)
        for s, row in zip(scores, held_out, strict=True)
    )
    prior = [row for row in train_rows if row["source"] == "label"]
    recomputed = evaluate(scores, held_out, prior, config.threshold)
    assert recomputed == pytest.approx(summary["metrics"], abs=1e-4)
    assert read_manifest(config.output_dir)["metrics"] == summary["metrics"]


def test_the_loaded_prm_scores_oracle_correct_training_steps_above_wrong_ones(trained, rows):
    config, _, _ = trained
    prm = load_prm(config.output_dir, device="cpu")
    labelled = [row for row in rows if row["source"] == "label"]
    scores = prm.batch_step_scores([(row["prompt"], row["completions"]) for row in labelled])
    good = [
        p for row, s in zip(labelled, scores, strict=True) for p, ok in zip(s, row["oracle_labels"], strict=True) if ok
    ]
    bad = [
        p
        for row, s in zip(labelled, scores, strict=True)
        for p, ok in zip(s, row["oracle_labels"], strict=True)
        if not ok
    ]
    assert len(good) > 50 and len(bad) > 50
    assert sum(good) / len(good) > sum(bad) / len(bad) + 0.15
    assert bad_step_auroc(scores, [row["oracle_labels"] for row in labelled]) > 0.75


def test_held_out_figures_come_with_their_trivial_baselines(trained, rows):
    config, summary, reporter = trained
    metrics = summary["metrics"]
    _, held_out = split_by_task(rows, config.eval_fraction, config.seed)
    held_out = [row for row in held_out if row["source"] == "label"]
    assert metrics["held_out_trajectories"] == len(held_out)
    clean = sum(all(row["labels"]) for row in held_out) / len(held_out)
    first_step_wrong = sum(not row["labels"][0] for row in held_out) / len(held_out)
    assert metrics["baseline_never_first_error_accuracy"] == pytest.approx(clean)
    assert metrics["baseline_first_step_first_error_accuracy"] == pytest.approx(first_step_wrong)
    assert metrics["baseline_majority_bad_step_f1"] == 0.0  # most training steps are good
    for name in ("bad_step_f1", "first_error_accuracy", "bad_step_auroc"):
        assert 0 <= metrics[name] <= 1 and 0 <= metrics[f"oracle_{name}"] <= 1
    assert reporter.series("eval_bad_step_f1") == [metrics["bad_step_f1"]]


def test_step_metrics_count_bad_steps_as_the_positive_class():
    truth = [[True, False, True], [True, True]]
    predicted = [[False, False, True], [True, True]]
    figures = step_metrics(predicted, truth)
    assert figures["bad_step_precision"] == 0.5 and figures["bad_step_recall"] == 1.0
    assert figures["bad_step_f1"] == pytest.approx(2 / 3)
    assert figures["step_accuracy"] == 0.8
    assert figures["first_error_accuracy"] == 0.5  # predicted 0 vs true 1; none vs none
    assert first_error([True, True]) is None and first_error([True, False, False]) == 1
    assert bad_step_auroc([[0.1, 0.9, 0.5]], [[False, True, False]]) == 1.0
    assert bad_step_auroc([[0.5, 0.5]], [[False, True]]) == 0.5


def _last_word(piece) -> str:
    """The last word of a step piece: of its text, or of its last (assistant) message's content."""
    return (piece if isinstance(piece, str) else piece[-1]["content"]).split()[-1]


@pytest.mark.parametrize("style", ["conversational", "text"])
def test_long_trajectories_are_cut_into_windows_that_read_every_step_once(episodes, tokenizer, style):
    rows = stepwise_rows(episodes, style=style)
    row = max(rows, key=lambda r: len(r["completions"]))
    whole = step_windows(tokenizer, row["prompt"], row["completions"], "", 4096)
    assert len(whole) == 1 and whole[0].steps == list(range(len(row["completions"])))
    windows = step_windows(tokenizer, row["prompt"], row["completions"], "", 64)
    assert len(windows) > 1
    assert [step for window in windows for step in window.steps] == list(range(len(row["completions"])))
    for window in windows:
        assert len(window.input_ids) <= 64 and window.input_ids[0] == tokenizer.bos_token_id
        for position, step in zip(window.positions, window.steps, strict=True):
            # A step is read at its piece's last token: the action word (rendered through the chat template, the
            # last before the end of the assistant's turn).
            assert tokenizer.decode([window.input_ids[position]]) == _last_word(row["completions"][step])
    examples = training_examples(tokenizer, [(row["prompt"], row["completions"], row["labels"])], "", 64)
    kept = [label for example in examples for label in example["labels"] if label != IGNORE]
    assert kept == [int(label) for label in row["labels"]]


def test_intervention_rows_train_only_while_use_intervention_labels_is_on(data_path, tiny_base_model, tmp_path):
    kept = main(config_for(data_path, tiny_base_model, tmp_path / "kept", max_steps=1))
    dropped = main(
        config_for(data_path, tiny_base_model, tmp_path / "dropped", max_steps=1, use_intervention_labels=False)
    )
    assert kept["train_rows_by_source"]["intervention"] > 0
    assert "intervention" not in dropped["train_rows_by_source"]
    assert dropped["train_rows_by_source"]["label"] == kept["train_rows_by_source"]["label"]
    assert dropped["train_trajectories"] == kept["train_trajectories"] - kept["train_rows_by_source"]["intervention"]
    assert dropped["eval_samples"] == kept["eval_samples"]


def test_a_run_resumes_from_its_last_checkpoint_after_a_crash(data_path, tiny_base_model, tmp_path):
    config = config_for(data_path, tiny_base_model, tmp_path / "model", max_steps=4, save_steps=2)
    with pytest.raises(RuntimeError, match="worker died"):
        main(config, RecordingReporter(raise_at=3, error=RuntimeError("worker died")))
    assert not (tmp_path / "model" / "tandem_artifact.json").exists()
    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert [step for step, _ in reporter.steps] == [3, 4]
    assert summary["global_step"] == 4
    assert load_prm(config.output_dir, device="cpu").step_scores(PROMPT, [[ACTION_UP]])


def test_a_cancel_raised_by_the_reporter_stops_training_within_one_step(data_path, tiny_base_model, tmp_path):
    assert_cancel_stops_training(main, config_for(data_path, tiny_base_model, tmp_path / "model", max_steps=50), 2)


def test_a_finished_run_directory_returns_its_summary_without_training(trained):
    config, summary, _ = trained
    assert_finished_returns_summary(main, config, summary)
    with pytest.raises(ConfigError, match="output_dir"):
        main(PRMConfig(**{**vars(config), "threshold": 0.3}))


def test_lora_adapters_are_merged_into_a_model_that_loads_and_scores(data_path, tiny_base_model, tmp_path):
    summary = main(config_for(data_path, tiny_base_model, tmp_path / "model", max_steps=2, use_lora=True, lora_r=4))
    assert summary["global_step"] == 2
    assert not (tmp_path / "model" / "adapter_config.json").exists()
    scores = load_prm(tmp_path / "model", device="cpu").step_scores(
        PROMPT, [[{"role": "assistant", "content": "a"}], [ACTION_UP]]
    )
    assert len(scores) == 2 and all(0 < p < 1 for p in scores)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": 0}, "threshold"),
        ({"use_intervention_labels": "yes"}, "use_intervention_labels"),
        ({"max_length": 0}, "max_length"),
        ({"step_separator": 3}, "step_separator"),
        ({"data_path": ""}, "data_path"),
        ({"learning_rate": -1}, "learning_rate"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(values, field):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(PRMConfig, {"data_path": "x.jsonl", "base_model": "base", **values})
    assert caught.value.field == field and str(caught.value).startswith(f"{field}:")


def test_rows_whose_labels_do_not_match_their_steps_are_refused_naming_the_data(rows, tiny_base_model, tmp_path):
    broken = [dict(rows[0], labels=rows[0]["labels"][:-1]), *rows[1:]]
    with pytest.raises(ConfigError, match=r"data_path: 1 of \d+ rows cannot be used: row 1: labels"):
        main(config_for(write_jsonl(broken, tmp_path / "rows.jsonl"), tiny_base_model, tmp_path / "model"))


def test_the_command_line_shows_help_and_trains_three_steps(data_path, tiny_base_model, tmp_path):
    shown = command_help("reward_models.prm")
    assert "--use_intervention_labels" in shown and "--threshold" in shown
    output_dir = tmp_path / "model"
    flags = {"data_path": data_path, "base_model": tiny_base_model, "output_dir": output_dir, "max_steps": 3}
    summary = run_command("reward_models.prm", {**flags, "use_intervention_labels": "false", "batch_size": 4})
    assert summary["global_step"] == 3 and "intervention" not in summary["train_rows_by_source"]
    assert "first_error_accuracy" in summary["metrics"]
    assert len(load_prm(output_dir, device="cpu").step_scores(PROMPT, [[ACTION_UP]])) == 1


def test_a_prm_on_tool_calls_reads_each_step_at_the_end_of_its_assistant_turn_with_the_rows_tools(
    tool_policy_dir, tmp_path
):
    from transformers import AutoTokenizer

    rows = tool_chat.stepwise_rows()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(tool_policy_dir))
    row = rows[0]
    [window] = step_windows(tokenizer, row["prompt"], row["completions"], "", 1024, row["tools"])
    text = tokenizer.decode(window.input_ids)
    assert text == tokenizer.apply_chat_template(
        row["prompt"] + [m for piece in row["completions"] for m in piece], tools=row["tools"], tokenize=False
    ).rstrip().removesuffix(tokenizer.eos_token)
    assert tool_chat.TOOLS_BLOCK in text
    # Each step is read at the last token of its assistant turn, before the token that ends the turn.
    assert [tokenizer.decode([window.input_ids[p]]) for p in window.positions] == [
        "</tool_call>",
        "</tool_call>",
        "done",
    ]
    data = write_jsonl(rows, tmp_path / "stepwise.jsonl")
    summary = main(config_for(data, tool_policy_dir, tmp_path / "model", max_steps=2, eval_fraction=0.34))
    assert summary["global_step"] == 2 and "bad_step_f1" in summary["metrics"]
    prm = load_prm(tmp_path / "model", device="cpu")
    scores = prm.step_scores(row["prompt"], row["completions"], row["tools"])
    conversation = tool_chat.trajectory(1, 1).messages
    assert prm.conversation_scores([conversation], [tool_chat.TOOLS]) == [pytest.approx(scores, abs=1e-6)]
    assert prm.step_scores(row["prompt"], row["completions"]) != scores  # the tools are read
