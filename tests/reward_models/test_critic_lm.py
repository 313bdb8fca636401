"""The generative critic pipeline: SFT on critiques, held-out loss and samples, a loadable artifact, LoRA, resume,
cancel, config errors and the command line. Tiny models on CPU, on oracle-labelled gridworld critiques."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reward_models.common.artifacts import ARTIFACT_MANIFEST, checkpoint_dir, read_manifest
from reward_models.common.config import ConfigError, config_from_dict
from reward_models.critic_lm import (
    CriticConfig,
    load_generative_critic,
    main,
)
from reward_models.critique_encoding import encode_example, fit_example
from reward_models.policy.turns import transcript
from simulation.episodes import scripted_episodes
from simulation.oracle_data import critique_rows, write_jsonl
from tests.reward_models import tool_chat
from tests.reward_models.reporters import RecordingReporter, RunCancelled

ROOT = Path(__file__).resolve().parents[2]
# Small grids and short episodes keep transcripts near 100-250 tokens, so a step takes a fraction of a second.
SMALL_GRID = {"size": 4, "max_steps": 6}


@pytest.fixture(scope="module")
def critiques_path(tmp_path_factory) -> Path:
    episodes = scripted_episodes(12, per_task=2, seed=0, env_config=SMALL_GRID)
    return write_jsonl(critique_rows(episodes), tmp_path_factory.mktemp("critiques") / "critiques.jsonl")


def critic_config(data: Path, base: Path, output_dir: Path, **overrides) -> CriticConfig:
    settings = {
        "data_path": str(data),
        "base_model": str(base),
        "output_dir": str(output_dir),
        "max_steps": 16,
        "learning_rate": 3e-3,
        "batch_size": 8,
        "max_length": 256,
        "max_new_tokens": 24,
        "logging_steps": 1,
        "save_steps": 100,
        "num_samples": 3,
        **overrides,
    }
    return CriticConfig(**settings)


@pytest.fixture(scope="module")
def trained(critiques_path, tiny_base_model, tmp_path_factory):
    """One full fine-tune shared by the tests that only read its results."""
    reporter = RecordingReporter()
    config = critic_config(critiques_path, tiny_base_model, tmp_path_factory.mktemp("critic") / "run")
    summary = main(config, reporter)
    return config, summary, reporter


def load_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_the_held_out_loss_and_the_training_loss_go_down(trained):
    _, summary, reporter = trained
    metrics = summary["metrics"]
    assert metrics["eval_loss"] < metrics["base_eval_loss"] - 0.5
    assert metrics["perplexity"] < metrics["base_perplexity"]
    assert metrics["mean_token_accuracy"] > metrics["base_mean_token_accuracy"]
    losses = reporter.series("loss")
    assert len(losses) == 16
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4
    assert [step for step, _ in reporter.steps] == list(range(1, 17))
    assert (summary["train_samples"], summary["eval_samples"]) == (20, 4)  # whole tasks held out
    assert summary["samples_per_second"] > 0 and summary["resumed_from"] is None


def test_every_weight_matrix_changed_in_a_full_fine_tune(trained, tiny_base_model):
    config, summary, _ = trained
    base, tuned = load_state(tiny_base_model), load_state(Path(config.output_dir))
    assert base.keys() == tuned.keys()
    matrices = [name for name, tensor in base.items() if tensor.dim() == 2]
    assert all(not torch.equal(base[name], tuned[name]) for name in matrices)
    assert summary["trainable_parameters"] == summary["total_parameters"]


def read_critiques(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def row_of(sample: dict, rows: list[dict]) -> dict:
    """The data row a summary sample was made from (samples show a conversational prompt as its transcript)."""
    [row] = [row for row in rows if "User: " + row["prompt"][0]["content"] == sample["prompt"]][:1]
    return row


def test_the_artifact_loads_and_writes_the_critiques_the_trained_model_wrote(trained, critiques_path):
    config, summary, _ = trained
    output_dir = Path(config.output_dir)
    manifest = read_manifest(output_dir)
    assert manifest["kind"] == "generative_critic"
    assert manifest["summary"]["metrics"] == summary["metrics"]
    assert not checkpoint_dir(output_dir).exists()

    critic = load_generative_critic(output_dir)
    rows = read_critiques(critiques_path)
    assert len(summary["samples"]) == 3
    for sample in summary["samples"]:
        row = row_of(sample, rows)
        assert sample["reference"] == row["completion"][0]["content"]
        assert sample["generated"] and isinstance(sample["generated"], str)
        # Greedy decoding: the loaded directory writes exactly what the model in memory wrote.
        assert critic.critique(row["prompt"]) == sample["generated"]
    # It has learnt the critiques' form: they start like the annotators' ("step ... is wrong" or "every step").
    assert critic.critique(rows[0]["prompt"]).split()[0] in {"step", "every"}


def test_a_second_call_on_a_finished_directory_returns_the_stored_summary_without_training(trained):
    config, summary, _ = trained
    reporter = RecordingReporter()
    again = main(config, reporter)
    assert again == json.loads(json.dumps(summary))
    assert reporter.steps == []
    with pytest.raises(ConfigError) as caught:
        main(critic_config(Path(config.data_path), Path(config.base_model), Path(config.output_dir), max_steps=17))
    assert caught.value.field == "output_dir"


def test_lora_trains_only_the_adapters_and_the_merged_artifact_loads(critiques_path, tiny_base_model, tmp_path):
    config = critic_config(
        critiques_path, tiny_base_model, tmp_path / "lora", use_lora=True, lora_r=4, max_steps=6, num_samples=1
    )
    summary = main(config)

    assert 0 < summary["trainable_parameters"] < summary["total_parameters"] // 4
    assert summary["lora_merged"] is True
    base, merged = load_state(tiny_base_model), load_state(tmp_path / "lora")
    # Plain weight names: the adapters were merged, no peft wrapper or adapter tensors are left.
    assert base.keys() == merged.keys()
    changed = {name for name in base if not torch.equal(base[name], merged[name])}
    # peft's default targets for Llama: the query and value projections of every layer, and nothing else.
    assert changed == {name for name in base if name.endswith(("q_proj.weight", "v_proj.weight"))}
    assert len(changed) == 4
    critic = load_generative_critic(tmp_path / "lora")
    [sample] = summary["samples"]
    assert critic.critique(row_of(sample, read_critiques(critiques_path))["prompt"]) == sample["generated"]


def test_a_crashed_run_resumes_from_its_last_checkpoint(critiques_path, tiny_base_model, tmp_path):
    config = critic_config(critiques_path, tiny_base_model, tmp_path / "run", max_steps=5, save_steps=2, num_samples=0)
    crash = RecordingReporter(raise_at=3, error=RuntimeError("worker killed"))
    with pytest.raises(RuntimeError, match="worker killed"):
        main(config, crash)
    assert not (tmp_path / "run" / ARTIFACT_MANIFEST).exists()
    assert (checkpoint_dir(tmp_path / "run") / "checkpoint-2").is_dir()

    reporter = RecordingReporter()
    summary = main(config, reporter)

    assert summary["resumed_from"].endswith("checkpoint-2")
    # The global step carries on from the checkpoint: steps 3 to 5, not 1 to 5.
    assert [step for step, _ in reporter.steps] == [3, 4, 5]
    assert summary["global_step"] == 5
    assert summary["samples"] == []
    assert load_generative_critic(tmp_path / "run").critique("System: reach the goal G") is not None


def test_a_cancel_raised_by_the_reporter_stops_training_within_one_step(critiques_path, tiny_base_model, tmp_path):
    config = critic_config(critiques_path, tiny_base_model, tmp_path / "run", max_steps=50)
    reporter = RecordingReporter(raise_at=2)
    with pytest.raises(RunCancelled):
        main(config, reporter)
    assert [step for step, _ in reporter.steps] == [1, 2]
    assert not (tmp_path / "run" / ARTIFACT_MANIFEST).exists()


def test_encoding_matches_trls_own_prompt_completion_preparation(critiques_path, tiny_base_model, tmp_path):
    """The critic tokenises rows itself (to cut long transcripts in the middle); short rows must come out exactly
    as SFTTrainer prepares the same prompt-completion rows, in both export styles."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base_model)
    episodes = scripted_episodes(3, per_task=1, seed=4, env_config=SMALL_GRID)
    for style in ("conversational", "text"):
        rows = [
            {"prompt": row["prompt"], "completion": row["completion"]} for row in critique_rows(episodes, style=style)
        ]
        args = SFTConfig(
            output_dir=str(tmp_path / style),
            report_to="none",
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            max_length=None,
        )
        trainer = SFTTrainer(
            model=str(tiny_base_model), args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
        )
        for row, prepared in zip(rows, trainer.train_dataset, strict=True):
            prompt, critique = encode_example(tokenizer, row["prompt"], row["completion"])
            assert prepared["input_ids"] == prompt + critique, style
            assert prepared["labels"] == [-100] * len(prompt) + critique, style
            assert critique[-1] == tokenizer.eos_token_id


def test_an_over_long_example_keeps_its_critique_and_loses_the_middle_of_its_prompt():
    prompt, critique = list(range(100)), [900, 901, 902]
    fitted_prompt, fitted_critique = fit_example(prompt, critique, 20)
    assert fitted_critique == critique
    assert fitted_prompt == list(range(8)) + list(range(91, 100))
    assert fit_example(prompt[:10], critique, 20) == (prompt[:10], critique)
    # A critique longer than half the budget keeps its first half and leaves the prompt the rest.
    long_prompt, long_critique = fit_example(prompt, list(range(500, 530)), 20)
    assert (len(long_prompt), long_critique) == (10, list(range(500, 510)))


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"num_samples": -1}, "num_samples"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 300, "max_length": 256}, "max_new_tokens"),
        ({"learning_rate": 2.0}, "learning_rate"),
        ({"lora_r": 0}, "lora_r"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ],
)
def test_a_bad_setting_names_its_field(settings, field):
    with pytest.raises(ConfigError) as caught:
        CriticConfig(data_path="d.jsonl", base_model="m", **settings)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_stored_settings_are_checked_by_name_and_type():
    with pytest.raises(ConfigError) as caught:
        config_from_dict(CriticConfig, {"data_path": "d.jsonl", "base_model": "m", "num_sample": 2})
    assert caught.value.field == "num_sample"
    with pytest.raises(ConfigError) as caught:
        config_from_dict(CriticConfig, {"data_path": "d.jsonl", "base_model": "m", "max_new_tokens": "many"})
    assert caught.value.field == "max_new_tokens"


def test_rows_without_a_critique_are_refused_naming_the_row(tiny_base_model, tmp_path):
    data = write_jsonl([{"prompt": "User: hello\nAssistant:", "completion": "  "}], tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError) as caught:
        main(critic_config(data, tiny_base_model, tmp_path / "run"))
    assert caught.value.field == "data_path"
    assert "row 1" in str(caught.value)


def test_the_command_line_shows_help_and_trains(critiques_path, tiny_base_model, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # where the packages are, if not beside the interpreter
    shown = subprocess.run(
        [sys.executable, "-m", "reward_models.critic_lm", "--help"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "--max_new_tokens" in shown.stdout and "--num_samples" in shown.stdout

    command = [sys.executable, "-m", "reward_models.critic_lm", "--data_path", str(critiques_path)]
    command += ["--base_model", str(tiny_base_model), "--output_dir", str(tmp_path / "cli"), "--max_steps", "3"]
    command += ["--max_length", "256", "--num_samples", "1", "--max_new_tokens", "8"]
    trained = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(trained.stdout)
    assert summary["global_step"] == 3
    assert (tmp_path / "cli" / ARTIFACT_MANIFEST).is_file()
    assert "3/3" in trained.stderr  # the console reporter's progress line


def test_a_critic_of_tool_calling_trajectories_reads_its_prompt_with_the_rows_tools_and_learns_the_critique_only(
    tool_policy_dir, tmp_path
):
    rows = []
    for index, row in enumerate(tool_chat.preference_rows(4)):
        shown = transcript(row["prompt"] + row["rejected"])
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{shown}\n\nCritique this trajectory."}],
                "completion": [{"role": "assistant", "content": "the add asks for one too many"}],
                "tools": tool_chat.TOOLS,
                "task_id": index,
            }
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tool_policy_dir)
    prompt, critique = encode_example(tokenizer, rows[0]["prompt"], rows[0]["completion"], rows[0]["tools"])
    assert tool_chat.TOOLS_BLOCK in tokenizer.decode(prompt) and "add(" in tokenizer.decode(prompt)
    assert tokenizer.decode(critique) == "the add asks for one too many<|im_end|>\n"
    data = write_jsonl(rows, tmp_path / "critiques.jsonl")
    config = critic_config(data, tool_policy_dir, tmp_path / "run", max_steps=2, batch_size=2, num_samples=1)
    summary = main(config)
    assert summary["global_step"] == 2 and len(summary["samples"]) == 1
