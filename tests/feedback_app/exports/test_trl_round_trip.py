"""Exports go from the HTTP endpoint straight into `datasets` and TRL's trainers, with no reshaping in between."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


@pytest.fixture
def download(client, labelled_project, researcher, tmp_path):
    """`download(kind, format, **filters)`: the export fetched over HTTP, loaded with `datasets.load_dataset`."""
    from datasets import load_dataset

    client.force_login(researcher)

    def fetch(kind: str, fmt: str = "jsonl", **filters):
        response = client.get(f"/api/projects/{labelled_project.pk}/exports/{kind}", {"format": fmt, **filters})
        assert response.status_code == 200
        path = tmp_path / f"{kind}.{fmt}"
        path.write_bytes(b"".join(response.streaming_content))
        builder = "json" if fmt == "jsonl" else "parquet"
        return load_dataset(builder, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf-cache"))

    return fetch


def training_args(config_class, tmp_path, **overrides):
    return config_class(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=5e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=0,
        **overrides,
    )


def parameters_of(model) -> dict:
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def assert_trains(trainer_class, config_class, model, dataset, tokenizer, tmp_path, **overrides) -> None:
    """Builds a TRL `trainer_class` for `model` (a model, or the path of a saved one) on `dataset`, trains it for
    three steps under `config_class` with `overrides`, and checks that a parameter changed and that the logged
    loss stayed finite and moved."""
    trainer = trainer_class(
        model=model,
        args=training_args(config_class, tmp_path, **overrides),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    before = parameters_of(trainer.model)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not after[name].detach().equal(value) for name, value in before.items()), "no parameter changed"
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert losses[0] != losses[-1], f"the loss did not move: {losses}"


def assert_tokenizes(tokenizer, conversations) -> None:
    """Every word of the exported turns is in the tiny policy's vocabulary (no <unk> once templated)."""
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) else ids
        assert tokenizer.unk_token_id not in ids, tokenizer.decode(ids)


def tiny_config(tokenizer, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def test_reward_trainer_trains_on_the_preference_export(download, policy_tokenizer, tmp_path):
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    dataset = download("preference")
    assert {"prompt", "chosen", "rejected", "margin"} <= set(dataset.column_names)
    assert_tokenizes(policy_tokenizer, (row["prompt"] + row["chosen"] for row in dataset))
    model = AutoModelForSequenceClassification.from_config(tiny_config(policy_tokenizer, num_labels=1))
    assert_trains(RewardTrainer, RewardConfig, model, dataset, policy_tokenizer, tmp_path)


def test_reward_trainer_also_reads_the_text_style(download, policy_tokenizer, tmp_path):
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    dataset = download("preference", "parquet", style="text")
    assert isinstance(dataset[0]["chosen"], str)
    model = AutoModelForSequenceClassification.from_config(tiny_config(policy_tokenizer, num_labels=1))
    assert_trains(RewardTrainer, RewardConfig, model, dataset, policy_tokenizer, tmp_path)


def test_dpo_trainer_trains_the_policy_on_the_preference_export(download, policy_tokenizer, tiny_policy_dir, tmp_path):
    from trl import DPOConfig, DPOTrainer

    dataset = download("preference")
    # The policy directory is a saved model, so DPO builds its reference model from the same path.
    assert_trains(DPOTrainer, DPOConfig, str(tiny_policy_dir), dataset, policy_tokenizer, tmp_path, max_length=512)


def test_dpo_trainer_trains_on_step_preferences(download, policy_tokenizer, tiny_policy_dir, tmp_path):
    from trl import DPOConfig, DPOTrainer

    dataset = download("step_preference")
    assert set(dataset["source"]) == {"intervention", "comparison"}
    assert_tokenizes(policy_tokenizer, (row["prompt"] + row["chosen"] for row in dataset))
    assert_trains(DPOTrainer, DPOConfig, str(tiny_policy_dir), dataset, policy_tokenizer, tmp_path, max_length=512)


def test_kto_trainer_trains_on_the_unpaired_export(download, policy_tokenizer, tiny_policy_dir, tmp_path):
    from trl import KTOConfig, KTOTrainer

    dataset = download("unpaired", "parquet")
    assert set(dataset["label"]) == {True, False}
    assert_tokenizes(policy_tokenizer, (row["prompt"] + row["completion"] for row in dataset))
    assert_trains(KTOTrainer, KTOConfig, str(tiny_policy_dir), dataset, policy_tokenizer, tmp_path, max_length=512)


def test_sft_trainer_trains_on_the_sft_export(download, policy_tokenizer, tiny_policy_dir, tmp_path):
    from trl import SFTConfig, SFTTrainer

    dataset = download("sft")
    assert set(dataset["source"]) == {"intervention", "demonstration"}
    assert_tokenizes(policy_tokenizer, dataset["messages"])
    assert_trains(SFTTrainer, SFTConfig, str(tiny_policy_dir), dataset, policy_tokenizer, tmp_path, max_length=512)


def test_a_token_classifier_prm_trains_on_the_stepwise_export(download, policy_tokenizer):
    """Labels sit on the last token of each step's piece (the step separator); everything else is ignored."""
    import torch
    from transformers import AutoModelForTokenClassification

    dataset = download("stepwise", neutral="negative", style="text")
    inputs, targets = [], []
    for row in dataset:
        ids = policy_tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        labels = [-100] * len(ids)
        for completion, good in zip(row["completions"], row["labels"], strict=True):
            piece = policy_tokenizer(completion, add_special_tokens=False)["input_ids"]
            ids += piece
            labels += [-100] * (len(piece) - 1) + [int(good)]
        inputs.append(ids)
        targets.append(labels)
    assert sum(label != -100 for labels in targets for label in labels) == sum(len(row["labels"]) for row in dataset)
    length = max(map(len, inputs))
    pad = policy_tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (length - len(ids)) for ids in inputs])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in inputs])
    labels = torch.tensor([labels + [-100] * (length - len(labels)) for labels in targets])

    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(tiny_config(policy_tokenizer, num_labels=2))
    before = parameters_of(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    after = dict(model.named_parameters())
    assert any(not after[name].detach().equal(value) for name, value in before.items())


GUIDE = Path(__file__).resolve().parents[3] / "docs" / "data.md"
DOWNLOAD = re.compile(r'-o (\S+)\s+"http://127\.0\.0\.1:8000(/api/projects/1/exports/(\w+)[^"]*)"')


def export_snippets() -> list[tuple[str, str, str, str]]:
    """(kind, file, URL path, block) for every python block of the data guide that opens with a curl download of an
    export: its leading comment lines, joined, name the file and the URL."""
    snippets = []
    for block in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S):
        header = " ".join(line.lstrip("#").strip().rstrip("\\") for line in block.splitlines() if line.startswith("#"))
        if header.startswith("curl ") and (download := DOWNLOAD.search(header)):
            file, url, kind = download.groups()
            snippets.append((kind, file, url, block))
    return snippets


def rows_in(path: Path) -> int:
    """How many rows a downloaded export holds: non-blank lines of JSON Lines, or the Parquet footer's count."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_metadata(path).num_rows
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def test_the_data_guide_has_a_run_snippet_for_each_kind_trl_trains_on():
    """Every kind TRL trains on as it is has a snippet the test below runs; `raw` has one for analysis."""
    kinds = [kind for kind, *_ in export_snippets()]
    assert {"preference", "step_preference", "unpaired", "sft", "critiques", "raw"} <= set(kinds)
    assert not {"stepwise", "returns"} & set(kinds), "TRL has no trainer for these kinds"


@pytest.mark.parametrize(
    ("kind", "file", "url", "snippet"), [pytest.param(*snippet, id=snippet[0]) for snippet in export_snippets()]
)
def test_the_data_guide_s_export_snippets_run_as_written(
    client, labelled_project, researcher, tiny_policy_dir, tmp_path, monkeypatch, kind, file, url, snippet
):
    """A data-guide snippet, character for character: the file its curl line names, downloaded from a project with
    labels of every kind, then the snippet itself in a folder where ``path/to/policy`` is a tiny saved policy. An
    empty download fails (an empty file trains nothing). Each trainer the snippet builds must take at least one step
    with a finite loss under TRL's own defaults."""
    import shutil

    from transformers import Trainer

    client.force_login(researcher)
    response = client.get(url.replace("/projects/1/", f"/projects/{labelled_project.pk}/"))
    assert response.status_code == 200
    (tmp_path / file).write_bytes(b"".join(response.streaming_content))
    assert rows_in(tmp_path / file) >= 1, f"the {kind} export the snippet downloads is empty"
    shutil.copytree(tiny_policy_dir, tmp_path / "path" / "to" / "policy")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.chdir(tmp_path)
    trained = {}
    train = Trainer.train

    def recording_train(self, *args, **kwargs):
        output = train(self, *args, **kwargs)
        trained[type(self).__name__] = (self.state.global_step, output.training_loss)
        return output

    monkeypatch.setattr(Trainer, "train", recording_train)
    exec(compile(snippet, "docs/data.md", "exec"), {})

    assert set(trained) == set(re.findall(r"\b(\w+Trainer)\(", snippet))
    for name, (steps, loss) in trained.items():
        assert steps >= 1 and math.isfinite(loss), f"{name}: {steps} steps, loss {loss}"
