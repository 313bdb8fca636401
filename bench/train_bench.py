"""Training overhead and judge-model throughput.

1. The reward model end to end through Tandem, from a dataset snapshot to a registered model (`create_judge_run` and
   the run body the training worker executes: snapshot check, pipeline, held-out evaluation, artifact, registry),
   against a plain TRL script that does only ``RewardTrainer.train()`` on the same file, model, steps and batch
   size. Our overhead is the share of our wall time the plain script does not spend.
2. Samples per second of each judge pipeline (reward model, PRM, value critic, generative critic) on the same kind
   of data, as each pipeline's summary reports it.

It works in a throwaway data directory with SQLite, on oracle-labelled gridworld pairs, on CPU unless CUDA is there::

    .venv/bin/python bench/train_bench.py
    .venv/bin/python bench/train_bench.py --steps 200 --hidden-size 128 --layers 4 --skip-throughput
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=150, help="Gridworld tasks; 3 episodes each, pairs within tasks.")
    parser.add_argument("--steps", type=int, default=100, help="Optimiser steps for both reward-model trainings.")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=2048, help="Long enough that no trajectory is cut.")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads.")
    parser.add_argument("--skip-throughput", action="store_true", help="Only the overhead comparison.")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "train_bench.json"))
    return parser.parse_args()


def setup_django(data_dir: Path) -> None:
    os.environ.update(
        {
            "TANDEM_DATA_DIR": str(data_dir),
            "DATABASE_URL": f"sqlite:///{data_dir / 'bench.sqlite3'}",
            "CELERY_TASK_ALWAYS_EAGER": "false",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "DJANGO_SETTINGS_MODULE": "feedback_app.settings",
            "SECRET_KEY": "train-bench-not-a-secret",
            # The base model is built beside the data folder, outside the project's own folders: shared, as an
            # operator shares a base model.
            "TANDEM_SHARED_MODEL_ROOTS": str(data_dir.parent),
        }
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def seed_project(base_dir: Path, tasks: int):
    """A project with a local base policy and a preference snapshot of oracle-labelled pairs."""
    from django.contrib.auth import get_user_model

    from feedback_app.exports.filters import ExportFilters
    from feedback_app.exports.snapshots import create_snapshot
    from feedback_app.imports import import_preference_stream
    from feedback_app.models import EnvironmentSpec, Membership, PolicyVersion, Project
    from simulation.episodes import scripted_episodes
    from simulation.oracle_data import preference_rows

    user = get_user_model().objects.create_user("bench", password="bench")
    environment, _ = EnvironmentSpec.objects.get_or_create(
        name="gridworld", defaults={"dotted_path": "reward_models.envs.gridworld.GridWorld"}
    )
    project = Project.objects.create(name="train bench", slug="train-bench", environment=environment)
    Membership.objects.create(user=user, project=project, role="researcher")
    PolicyVersion.objects.create(project=project, name="base", kind="local", weights_path=str(base_dir))
    rows = preference_rows(scripted_episodes(tasks, per_task=3, seed=0), beta=10.0, epsilon=0.1, seed=0)
    pairs = ({key: row[key] for key in ("prompt", "chosen", "rejected")} for row in rows)
    import_preference_stream(project, user, enumerate(pairs, 1))
    snapshot = create_snapshot(project, "preference", ExportFilters(), user=user, name="bench pairs")
    return project, user, snapshot


def tandem_reward_model(project, user, snapshot, args) -> tuple[float, dict]:
    from training.judges import create_judge_run, run_judge
    from training.runs import RunRecorder, execute_run

    config = {
        "max_steps": args.steps,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "eval_fraction": 0.1,
        "save_steps": max(1, args.steps // 4),
        "logging_steps": 10,
        "precision": "fp32",
    }
    started, cpu = time.perf_counter(), time.process_time()
    run = create_judge_run(project, "reward_model", snapshot=snapshot, config=config, created_by=user)
    execute_run(run.pk, run_judge, lambda pk: RunRecorder(pk, check_interval=0.0))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    run.refresh_from_db()
    if run.status != "succeeded":
        raise SystemExit(f"the Tandem run failed:\n{run.error}")
    return wall, cpu, run.summary


def plain_trl_reward_model(snapshot_path: Path, base_dir: Path, output_dir: Path, args) -> tuple[float, float]:
    """What a researcher would write by hand: load the file, build the model, `RewardTrainer(...).train()`.
    Only the `train()` call is timed."""
    from datasets import load_dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    dataset = load_dataset("json", data_files=str(snapshot_path), split="train")
    dataset = dataset.select_columns(["prompt", "chosen", "rejected"])
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    config = RewardConfig(
        output_dir=str(output_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        max_length=args.max_length,
        learning_rate=1e-4,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = RewardTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    started, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    return time.perf_counter() - started, time.process_time() - cpu


def judge_throughput(base_dir: Path, work: Path, args) -> dict[str, float]:
    """Each pipeline's own samples/s on oracle data (fewer steps: the figure is a rate)."""
    from reward_models.common.config import config_from_dict
    from simulation.episodes import scripted_episodes
    from simulation.oracle_data import (
        critique_rows,
        intervention_rows,
        preference_rows,
        returns_rows,
        stepwise_rows,
        write_jsonl,
    )
    from training.judges import PIPELINES

    episodes = scripted_episodes(60, per_task=3, seed=1)
    data = {
        "reward_model": preference_rows(episodes),
        "prm": stepwise_rows(episodes, epsilon=0.1) + intervention_rows(episodes),
        "value_critic": returns_rows(episodes),
        "generative_critic": critique_rows(episodes),
        "preference_model": preference_rows(episodes),
    }
    figures = {}
    for kind, pipeline in PIPELINES.items():
        config_class, main = pipeline.config_class, pipeline.main
        path = write_jsonl(data[kind], work / f"{kind}.jsonl")
        config = config_from_dict(
            config_class,
            {
                "data_path": str(path),
                "base_model": str(base_dir),
                "output_dir": str(work / f"{kind}-model"),
                "max_steps": max(10, args.steps // 3),
                "batch_size": args.batch_size,
                "max_length": args.max_length,
                "eval_fraction": 0.1,
                "precision": "fp32",
            },
        )
        summary = main(config)
        figures[kind] = summary["samples_per_second"]
    return figures


def main() -> None:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="tandem-train-bench-") as tmp:
        work = Path(tmp)
        setup_django(work / "data")
        from simulation.oracle_data import build_tiny_base

        base_dir = build_tiny_base(
            work / "base",
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            num_heads=4,
            intermediate_size=2 * args.hidden_size,
        )
        project, user, snapshot = seed_project(base_dir, args.tasks)

        print(
            f"snapshot: {snapshot.row_count} pairs; model hidden {args.hidden_size} x {args.layers} layers; "
            f"{args.steps} steps of batch {args.batch_size}; torch threads {args.threads}"
        )
        plain, plain_cpu = plain_trl_reward_model(snapshot.file, base_dir, work / "plain", args)
        ours, ours_cpu, summary = tandem_reward_model(project, user, snapshot, args)
        overhead, cpu_overhead = (ours - plain) / ours, (ours_cpu - plain_cpu) / ours_cpu
        result = {
            "pairs": snapshot.row_count,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "plain_trl_train_seconds": round(plain, 2),
            "tandem_end_to_end_seconds": round(ours, 2),
            "overhead_fraction": round(overhead, 4),
            "plain_trl_cpu_seconds": round(plain_cpu, 2),
            "tandem_cpu_seconds": round(ours_cpu, 2),
            "cpu_overhead_fraction": round(cpu_overhead, 4),
            "load_average": os.getloadavg(),
            "tandem_held_out": summary.get("metrics", {}),
        }
        print(f"plain TRL RewardTrainer.train(): {plain:.1f} s wall, {plain_cpu:.1f} s CPU")
        print(f"Tandem snapshot -> registered model: {ours:.1f} s wall, {ours_cpu:.1f} s CPU")
        print(
            f"overhead: {100 * overhead:.1f} % of Tandem's wall time (bar: under 10 %), "
            f"{100 * cpu_overhead:.1f} % of its CPU time"
        )
        print(f"load average now: {os.getloadavg()} (other work on the machine inflates whichever part it overlaps)")
        if not args.skip_throughput:
            result["samples_per_second"] = judge_throughput(base_dir, work, args)
            for kind, rate in result["samples_per_second"].items():
                print(f"{kind:>18}: {rate:.1f} samples/s")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
