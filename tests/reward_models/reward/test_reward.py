"""The reward-model pipeline: Bradley-Terry through TRL's RewardTrainer on oracle-labelled gridworld comparisons,
with a tiny untrained Llama on CPU."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from reward_models.common.artifacts import last_checkpoint, read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.common.data import split_by_task
from reward_models.policy.turns import text_pair
from reward_models.reward.config import RewardConfig
from reward_models.reward.model import evaluate, load_reward_model
from reward_models.reward.train import main
from simulation.episodes import scripted_episodes
from simulation.oracle_data import preference_rows, write_jsonl
from tests.launch import command_help, run_command
from tests.reward_models import tool_chat
from tests.reward_models.conftest import in_hub_cache
from tests.reward_models.reporters import RecordingReporter, RunCancelled, train_recorded

# A small grid and a short step limit keep transcripts near 120 tokens, so a training step takes milliseconds.
SMALL_GRID = {"size": 4, "max_steps": 6}
# Settings under which the tiny model learns within a few dozen steps.
FAST = {"batch_size": 8, "learning_rate": 5e-3, "logging_steps": 1, "save_steps": 1000}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    episodes = scripted_episodes(30, per_task=4, seed=0, env_config=SMALL_GRID)
    return preference_rows(episodes, ties="include")


@pytest.fixture(scope="module")
def data_path(rows, tmp_path_factory) -> Path:
    return write_jsonl(rows, tmp_path_factory.mktemp("reward-data") / "preference.jsonl")


@pytest.fixture(scope="module")
def trained(data_path, tiny_base_model, tmp_path_factory):
    """One 40-step run: (config, summary, reporter)."""
    output_dir = tmp_path_factory.mktemp("reward") / "run"
    return train_recorded(main, RewardConfig, data_path, tiny_base_model, output_dir, max_steps=40, **FAST)


def make_config(data_path: Path, base: Path, output_dir: Path, **overrides) -> RewardConfig:
    return RewardConfig(
        data_path=str(data_path), base_model=str(base), output_dir=str(output_dir), **{**FAST, **overrides}
    )


def held_out(rows: list[dict], config: RewardConfig) -> list[dict]:
    return split_by_task(rows, config.eval_fraction, config.seed)[1]


def test_training_lowers_the_loss_changes_the_weights_and_reports_every_step(trained, tiny_base_model):
    from safetensors.torch import load_file

    config, summary, reporter = trained
    losses = reporter.series("loss")
    assert len(losses) == 40
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.1
    assert [current for current, _ in reporter.steps] == list(range(1, 41))
    for name in ("accuracy", "grad_norm", "learning_rate"):
        assert len(reporter.series(name)) == 40, name

    base = load_file(tiny_base_model / "model.safetensors")
    trained_weights = load_file(Path(config.output_dir) / "members/0/model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert (trained_weights[name] - base[name]).abs().max() > 1e-4
    assert trained_weights["score.weight"].shape == (1, 32)
    assert summary["train_samples"] > 0 and summary["samples_per_second"] > 0
    assert not (Path(config.output_dir) / "checkpoints").exists()


def test_the_saved_model_scores_the_held_out_pairs_as_the_trained_one_did(trained, rows):
    config, summary, _ = trained
    metrics = summary["metrics"]
    model = load_reward_model(config.output_dir)
    again = evaluate(model, held_out(rows, config), config.ece_bins)
    assert again["pairs"] == metrics["pairs"] == summary["eval_samples"] - metrics["tie_pairs"]
    for name in ("accuracy", "log_loss", "ece", "shorter_wins_accuracy", "tie_mean_abs_gap"):
        assert again[name] == pytest.approx(metrics[name], abs=1e-4), name
    assert set(metrics["by_pair_type"]) == {"both_succeeded", "one_succeeded", "both_failed"}
    assert sum(group["pairs"] for group in metrics["by_pair_type"].values()) == metrics["pairs"]
    assert metrics["accuracy"] > 0.6


def test_the_loaded_model_prefers_the_oracle_better_trajectory_on_training_pairs(trained, rows):
    config, _, _ = trained
    model = load_reward_model(config.output_dir)
    eval_tasks = {row["task_id"] for row in held_out(rows, config)}
    pairs = [row for row in rows if row["task_id"] not in eval_tasks and not row["tie"]]
    better = [row["chosen"] if row["oracle_preferred"] else row["rejected"] for row in pairs]
    worse = [row["rejected"] if row["oracle_preferred"] else row["chosen"] for row in pairs]
    probabilities, spread = model.preference_probabilities([row["prompt"] for row in pairs], better, worse)
    assert spread is None
    assert sum(p > 0.5 for p in probabilities) / len(pairs) > 0.7

    mean, std = model.score([pairs[0]["prompt"]] * 2, [better[0], worse[0]])
    assert std is None
    assert model.preference_probability(pairs[0]["prompt"], better[0], worse[0])[0] == pytest.approx(
        1 / (1 + math.exp(mean[1] - mean[0])), abs=1e-5
    )


def test_a_score_does_not_depend_on_the_other_sequences_in_its_batch(trained, rows):
    config, _, _ = trained
    model = load_reward_model(config.output_dir)
    assert model.tokenizer.padding_side == "left"  # ours pad on the right, as TRL's collator did in training
    prompt = rows[0]["prompt"]
    completions = sorted([row["chosen"] for row in rows[:6]], key=len)
    together, _ = model.score([prompt] * len(completions), completions)
    alone = [model.score([prompt], [completion])[0][0] for completion in completions]
    assert len({len(model.encode(prompt, completion)) for completion in completions}) > 1
    assert together == pytest.approx(alone, abs=1e-5)


def test_tie_rows_alone_train_towards_equal_scores(rows, tiny_base_model, tmp_path):
    ties = [row for row in rows if row["tie"]]
    config = make_config(
        write_jsonl(ties, tmp_path / "ties.jsonl"),
        tiny_base_model,
        tmp_path / "run",
        ties="tie_loss",
        eval_fraction=0.0,
        max_steps=8,
    )
    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert summary["train_samples"] == len(ties) and summary["dropped_ties"] == 0
    losses = reporter.series("loss")
    # -1/2 log s(d) - 1/2 log s(-d) is at least log 2, reached at d = 0; a preference loss would fall below it.
    assert len(losses) == 8 and min(losses) >= math.log(2) - 1e-4
    assert len(reporter.series("tie_gap")) == 8


def test_tie_loss_keeps_tie_rows_that_drop_leaves_out(rows, data_path, tiny_base_model, tmp_path):
    kept = main(make_config(data_path, tiny_base_model, tmp_path / "kept", ties="tie_loss", max_steps=3))
    dropped = main(make_config(data_path, tiny_base_model, tmp_path / "dropped", ties="drop", max_steps=3))
    train_ties = sum(row["tie"] for row in split_by_task(rows, 0.2, 0)[0])
    assert train_ties > 0
    assert dropped["dropped_ties"] == train_ties and kept["dropped_ties"] == 0
    assert kept["train_samples"] == dropped["train_samples"] + train_ties


def trained_in_layout(layout, rows, data_path, tiny_base_model, tmp_path):
    """A reward model trained a few steps in `layout` and loaded as scoring loads it; a row with observations between
    its first and its last; and that row's completion with a different map in the first of those."""
    config = make_config(data_path, tiny_base_model, tmp_path / "run", layout=layout, max_steps=3)
    main(config)
    model = load_reward_model(config.output_dir, device="cpu")
    assert model.layout == layout
    row = next(row for row in rows if len(row["chosen"]) > 4)
    remapped = [dict(message) for message in row["chosen"]]
    middle = next(index for index, message in enumerate(remapped[:-1]) if message["role"] == "user")
    remapped[middle]["content"] = "# # # a different map # # #"
    return model, row, remapped


def test_a_decisions_layout_model_reads_only_decisions_in_training_and_in_scoring(
    rows, data_path, tiny_base_model, tmp_path
):
    model, row, changed = trained_in_layout("decisions", rows, data_path, tiny_base_model, tmp_path)
    elided = model.encode(row["prompt"], row["chosen"])
    # The observations between the first and the last are not read: changing one leaves the ids as they were,
    # while a full-layout model reads it.
    assert model.encode(row["prompt"], changed) == elided
    model.layout = "full"
    assert model.encode(row["prompt"], changed) != model.encode(row["prompt"], row["chosen"])
    assert len(model.encode(row["prompt"], row["chosen"])) > len(elided)


def test_an_actions_layout_model_reads_every_observation_and_action_but_no_reasoning(
    rows, data_path, tiny_base_model, tmp_path
):
    model, row, remapped = trained_in_layout("actions", rows, data_path, tiny_base_model, tmp_path)
    read = model.encode(row["prompt"], row["chosen"])
    reworded = [
        {**message, "content": "goal is down 0 ; " + message["content"]} if message["role"] == "assistant" else message
        for message in row["chosen"]
    ]
    assert model.encode(row["prompt"], reworded) == read
    moved = [dict(message) for message in row["chosen"]]
    moved[0]["content"] = "goal is up 9 ; action somewhere"
    assert model.encode(row["prompt"], moved) != read
    assert model.encode(row["prompt"], remapped) != read


def test_a_bootstrap_ensemble_gives_a_spread_and_resumes_its_current_member(data_path, tiny_base_model, tmp_path):
    config = make_config(
        data_path,
        tiny_base_model,
        tmp_path / "run",
        ensemble_size=2,
        ensemble_mode="bootstrap",
        max_steps=6,
        save_steps=2,
    )
    crash = RecordingReporter(raise_at=9, error=RuntimeError("worker lost"))  # member 1, its step 3
    with pytest.raises(RuntimeError, match="worker lost"):
        main(config, crash)
    assert (tmp_path / "run/members/0/tandem_member.json").is_file()
    assert not (tmp_path / "run/members/1").exists()

    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert "member 0: already trained" in reporter.lines
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert reporter.steps[0] == (9, 12) and reporter.steps[-1] == (12, 12)
    first, second = summary["members"]
    assert first["data_digest"] != second["data_digest"]
    assert first["distinct_pairs"] < first["train_pairs"] and second["distinct_pairs"] < second["train_pairs"]
    assert summary["metrics"]["mean_member_std"] > 0

    model = load_reward_model(config.output_dir)
    assert len(model.members) == 2
    row = json.loads(data_path.read_text().splitlines()[0])
    mean, std = model.score([row["prompt"]] * 2, [row["chosen"], row["rejected"]])
    assert std is not None and len(std) == 2 and all(s > 0 for s in std)
    p, p_std = model.preference_probability(row["prompt"], row["chosen"], row["rejected"])
    assert 0 < p < 1 and p_std > 0


def test_a_run_resumes_from_its_last_checkpoint_after_a_crash(data_path, tiny_base_model, tmp_path):
    config = make_config(data_path, tiny_base_model, tmp_path / "run", max_steps=6, save_steps=2)
    with pytest.raises(RuntimeError):
        main(config, RecordingReporter(raise_at=5, error=RuntimeError("killed")))
    assert sorted(p.name for p in (tmp_path / "run/checkpoints").glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    # A worker killed while saving leaves a newer folder with weights but no trainer_state.json (written last).
    half_written = tmp_path / "run/checkpoints/checkpoint-5"
    shutil.copytree(tmp_path / "run/checkpoints/checkpoint-4", half_written)
    (half_written / "trainer_state.json").unlink()
    assert last_checkpoint(tmp_path / "run").endswith("checkpoint-4")

    reporter = RecordingReporter()
    summary = main(config, reporter)
    assert summary["resumed_from"].endswith("checkpoint-4")
    assert [current for current, _ in reporter.steps] == [5, 6]
    assert summary["members"][0]["steps"] == 6


def test_a_cancel_raised_by_the_reporter_stops_training_within_one_step(data_path, tiny_base_model, tmp_path):
    config = make_config(data_path, tiny_base_model, tmp_path / "run", max_steps=20)
    reporter = RecordingReporter(raise_at=3, error=RunCancelled())
    with pytest.raises(RunCancelled):
        main(config, reporter)
    assert [current for current, _ in reporter.steps] == [1, 2, 3]
    assert not (tmp_path / "run/tandem_artifact.json").exists()
    assert not (tmp_path / "run/members/0").exists()


def test_a_finished_run_directory_returns_its_summary_without_training(trained):
    config, summary, _ = trained
    reporter = RecordingReporter()
    assert main(config, reporter) == json.loads(json.dumps(summary))
    assert reporter.steps == []
    changed = RewardConfig(**{**config.__dict__, "learning_rate": 1e-3})
    with pytest.raises(ConfigError) as error:
        main(changed)
    assert error.value.field == "output_dir"


def test_lora_adapters_are_merged_into_a_model_that_loads_without_peft(data_path, tiny_base_model, tmp_path):
    config = make_config(data_path, tiny_base_model, tmp_path / "run", use_lora=True, lora_r=4, max_steps=3)
    main(config)
    member = tmp_path / "run/members/0"
    assert (member / "model.safetensors").is_file() and not (member / "adapter_config.json").exists()
    model = load_reward_model(tmp_path / "run")
    row = json.loads(data_path.read_text().splitlines()[0])
    assert math.isfinite(model.score([row["prompt"]], [row["chosen"]])[0][0])


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"ties": "maybe"}, "ties"),
        ({"ensemble_size": 0}, "ensemble_size"),
        ({"ensemble_mode": "bagging"}, "ensemble_mode"),
        ({"ece_bins": 0}, "ece_bins"),
        ({"layout": "summary"}, "layout"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"use_margin": "yes"}, "use_margin"),
        ({"margin_scale": 2.0}, "margin_scale"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(values, field):
    with pytest.raises(ConfigError) as error:
        config_from_dict(RewardConfig, {"data_path": "x.jsonl", "base_model": "m", **values})
    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: ")


def test_rows_without_a_rejected_side_are_refused_naming_the_data(tiny_base_model, tmp_path):
    path = write_jsonl([{"prompt": "p", "chosen": "a", "task_id": 1}], tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="row 1: it has no 'rejected'") as error:
        main(make_config(path, tiny_base_model, tmp_path / "run"))
    assert error.value.field == "data_path"


def test_the_command_line_shows_help_and_trains_on_text_rows(tiny_base_model, tmp_path):
    shown = command_help("reward_models.reward")
    assert "--ensemble_mode" in shown and "--ties" in shown
    # argparse %-formats help texts: an unescaped "30 % slower" printed the parser's own state in its place.
    assert "~30 % slower" in " ".join(shown.split()) and "option_strings" not in shown

    episodes = scripted_episodes(6, per_task=3, seed=4, env_config=SMALL_GRID)
    data = write_jsonl(preference_rows(episodes, style="text"), tmp_path / "text.jsonl")
    flags = {"data_path": data, "base_model": tiny_base_model, "output_dir": tmp_path / "run", "max_steps": 3}
    summary = run_command("reward_models.reward", {**flags, "batch_size": 4})
    assert summary["members"][0]["steps"] == 3
    assert read_manifest(tmp_path / "run")["summary"] == summary
    model = load_reward_model(tmp_path / "run")
    assert model.style == "text" and model.score([episodes[0].messages[0]["content"]], [" action up"])[1] is None
    # Trained on text rows, it reads a conversation (as PPO hands it one) as the text export lays it out.
    prompt, completion = episodes[0].prompt, episodes[0].messages[len(episodes[0].prompt) :]
    assert model.encode(prompt, completion) == model.encode(*text_pair(prompt, completion))


def test_a_reward_model_on_tool_calls_reads_rows_through_the_chat_template_with_their_tools(tool_policy_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = tool_chat.preference_rows()
    # Parquet, as the exports write it: the tools are JSON text there.
    table = pa.Table.from_pylist([{**row, "tools": json.dumps(row["tools"])} for row in rows])
    pq.write_table(table, tmp_path / "pairs.parquet")
    config = make_config(
        tmp_path / "pairs.parquet", tool_policy_dir, tmp_path / "run", max_steps=2, eval_fraction=0.34
    )
    summary = main(config)
    assert summary["members"][0]["steps"] == 2 and summary["metrics"]["pairs"] > 0
    model = load_reward_model(tmp_path / "run", device="cpu")
    assert model.style == "conversational"
    row = rows[0]
    read = model.tokenizer.decode(model.encode(row["prompt"], row["chosen"], row["tools"]))
    assert read == model.tokenizer.apply_chat_template(
        row["prompt"] + row["chosen"], tools=row["tools"], tokenize=False
    )
    assert tool_chat.TOOLS_BLOCK in read and "<tool_call>" in read and "<tool_response>" in read
    with_tools, _ = model.score([row["prompt"]], [row["chosen"]], [row["tools"]])
    without, _ = model.score([row["prompt"]], [row["chosen"]])
    assert with_tools != without
    with pytest.raises(ValueError, match="conversations"):
        model.score(["Add k7 quantity 2."], [" done"])


def test_a_base_model_is_named_by_a_hub_id_read_from_the_local_cache_or_refused_saying_so(
    rows, tiny_base_model, tmp_path, monkeypatch
):
    in_hub_cache(tiny_base_model, "tandem-test/base", tmp_path / "hub", monkeypatch)
    few = write_jsonl(rows[:24], tmp_path / "few.jsonl")
    config = make_config(few, "tandem-test/base", tmp_path / "rm", max_steps=2)
    summary = main(config)
    assert read_manifest(tmp_path / "rm")["config"]["base_model"] == "tandem-test/base"  # the name the user gave
    assert summary["train_samples"] > 0
    assert evaluate(load_reward_model(tmp_path / "rm"), held_out(rows[:24], config), config.ece_bins)["pairs"] > 0
    with pytest.raises(ConfigError) as missing:
        main(make_config(few, "tandem-test/not-cached", tmp_path / "rm2", max_steps=2))
    assert missing.value.field == "base_model" and "huggingface-cli download" in str(missing.value)


def test_a_training_batch_run_in_groups_of_like_length_gives_the_whole_batchs_rewards_and_gradients(tiny_base_model):
    import torch
    from transformers import AutoModelForSequenceClassification

    from reward_models.reward.trainer import _ByLength

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_base_model), num_labels=1)
    pad_id = model.config.pad_token_id
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 90, 7, 88, 40, 6, 41, 3]
    # Right-padded, as TRL's preference collator pads: the chosen rows, then the rejected ones.
    input_ids = torch.full((len(lengths), max(lengths)), pad_id)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(3, model.config.vocab_size, (length,), generator=generator)
        attention_mask[row, :length] = 1

    def rewards_and_gradient(forward) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        logits = forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        chosen, rejected = logits.squeeze(-1).chunk(2)
        (-torch.nn.functional.logsigmoid(chosen - rejected).mean()).backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return logits.detach(), gradient

    whole = rewards_and_gradient(model)
    grouped = rewards_and_gradient(_ByLength(model))
    assert torch.allclose(grouped[0], whole[0], atol=1e-5)
    assert whole[1].abs().max() > 0 and torch.allclose(grouped[1], whole[1], rtol=1e-4, atol=1e-6)
    # A batch padded on the left runs as one: cut to a group's width, its rows would lose their tokens.
    input_ids, attention_mask = input_ids.flip(-1), attention_mask.flip(-1)
    assert torch.equal(rewards_and_gradient(_ByLength(model))[0], rewards_and_gradient(model)[0])
