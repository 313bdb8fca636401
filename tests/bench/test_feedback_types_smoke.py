"""bench/feedback_types.py at a smoke setting, as its command line runs it: a real web server and Celery worker on
the embedded defaults, every arm labelling through the REST API for its annotator budget, training its judges and
its policy, and the figures written as JSON and SVG."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.bench.test_loop_bench import BENCH

# The shipped tool policy is copied in seconds; the default careless agent takes minutes of fine-tuning to build.
SMOKE = ["--env", "toolshop", "--seeds", "0", "--budgets", "2", "--tasks", "3", "--samples", "2", "--ensemble", "1"]
SMOKE += ["--iterations", "1", "--episodes", "2", "--eval_tasks", "2", "--eval_samples", "1"]


def test_a_smoke_run_takes_every_arm_through_the_server_and_the_worker_and_writes_its_figures(tmp_path):
    out, plot = tmp_path / "figures.json", tmp_path / "plot.png"
    command = [sys.executable, str(BENCH.with_name("feedback_types.py")), *SMOKE, "--work_dir", str(tmp_path)]
    command += ["--out", str(out), "--plot", str(plot), "--parallel", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    done = subprocess.run(command, cwd=BENCH.parent.parent, env=env, capture_output=True, text=True, timeout=900)

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = json.loads(out.read_text())
    rows = {row["arm"]: row for row in figures["table"]}
    assert set(rows) == {"comparisons", "step_labels", "interventions", "mix", "oracle"}
    # Each arm labelled what it asks for, within its budget (a label may finish past it), and nothing else.
    assert rows["comparisons"]["comparisons"] > 0 and rows["comparisons"]["step_items"] == 0
    assert rows["step_labels"]["step_items"] > 0 and rows["step_labels"]["comparisons"] == 0
    assert rows["interventions"]["interventions"] > 0
    assert rows["mix"]["comparisons"] > 0 and rows["mix"]["step_items"] > 0
    assert rows["oracle"]["annotator_minutes"] == 0
    for arm, row in rows.items():
        assert 0 <= row["annotator_minutes"] <= 2 + 2, arm
        assert 0 <= row["sampled_success"] <= 1 and 0 <= row["greedy_success"] <= 1, arm
    judges = figures["raw"]["0"]
    assert judges["comparisons"]["points"][0]["judges"]["reward_model"]
    assert judges["step_labels"]["points"][0]["judges"]["prm"]
    # The oracle's first run scored the base policy once for every arm, and each arm's gains pair with it.
    assert "sampled_per_task" in judges["oracle"]["base"]
    assert all("sampled_gain" in point["gains"] for arm in judges.values() for point in arm["points"])
    assert set(figures["plot_svg"]) == {"sampled", "greedy"}
    assert all("<svg" in svg for svg in figures["plot_svg"].values())
    assert "best_arm" in figures["verdict"]
