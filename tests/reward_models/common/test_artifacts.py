"""The artifact manifest when several processes of one launch write it (torchrun, accelerate launch)."""

from __future__ import annotations

import json
import multiprocessing

from reward_models.common.artifacts import ARTIFACT_MANIFEST, write_manifest


def _write_many(output_dir: str, writer: int, times: int) -> None:
    for _ in range(times):
        write_manifest(output_dir, kind="test", config={"writer": writer}, metrics={})


def test_processes_writing_one_manifest_at_once_all_succeed_and_leave_a_whole_file(tmp_path):
    # One shared partial file made the slower rename fail (FileNotFoundError), as a DPO run under torchrun did in CI.
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_many, args=(str(tmp_path), writer, 300)) for writer in range(3)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
    assert [process.exitcode for process in writers] == [0, 0, 0]
    manifest = json.loads((tmp_path / ARTIFACT_MANIFEST).read_text())
    assert manifest["kind"] == "test" and manifest["config"]["writer"] in {0, 1, 2}
    assert not list(tmp_path.glob("*.part"))


def test_only_the_first_process_of_a_launch_writes_the_trained_policy(tmp_path, monkeypatch):
    from reward_models.finetune.artifacts import save_trained_policy

    class Config:
        output_dir = str(tmp_path / "run")

    monkeypatch.setenv("RANK", "1")
    path = save_trained_policy(None, None, {}, Config(), kind="dpo", metrics={}, summary={})
    assert path == tmp_path / "run" / ARTIFACT_MANIFEST and not (tmp_path / "run").exists()
