"""The parts of bench/feedback_types.py that need no server: its arguments, what each arm queues for its annotator
time, and the report over seeds: mean gains, their standard errors, the arms' paired differences and the bars."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from tests.bench.test_loop_bench import BENCH, _load_bench


@pytest.fixture(scope="module")
def bench():
    return _load_bench(BENCH.with_name("feedback_types.py"), "feedback_types_bench")


def test_the_arguments_are_checked_and_name_the_option(bench, capsys):
    args = bench.parse_args([])
    assert (args.budget_minutes, args.seed_list, args.arm_names, args.rounds) == (
        [30.0, 60.0, 120.0],
        [0, 1, 2],
        ["comparisons", "step_labels", "interventions", "mix", "oracle"],
        3,
    )
    for argv, message in (
        (["--arms", "comparisons,votes"], "--arms: unknown ['votes']"),
        (["--budgets", "30,20"], "--budgets: each must be larger"),
        (["--budgets", "ten"], "--budgets: comma-separated numbers"),
        (["--seeds", "1,1"], "--seeds: distinct"),
        (["--samples", "1"], "--samples: must be at least 2"),
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_each_arm_queues_half_as_many_again_as_its_budget_buys_at_most_what_the_rollout_makes(bench):
    from feedback_app.annotator_time import AnnotatorTime

    args = bench.parse_args(["--tasks", "64", "--samples", "3"])
    arms = bench.ArmLoop(args, [], [])
    times = AnnotatorTime()
    # 30 minutes: comparisons at 30 s, first-error marks at 20 s, a mark and a correction at 20 + 40 s.
    assert arms.queued("comparisons", 0) == (math.ceil(1.5 * 1800 / times.comparison), 0)
    assert arms.queued("step_labels", 0) == (0, math.ceil(1.5 * 1800 / times.first_error))
    assert arms.queued("interventions", 0) == (0, math.ceil(1.5 * 1800 / (times.first_error + times.intervention)))
    assert arms.queued("mix", 0) == (
        math.ceil(1.5 * 900 / times.comparison),
        math.ceil(1.5 * 900 / times.first_error),
    )
    # The third round's 60 minutes buy more first-error marks than the rollout's 192 trajectories.
    assert arms.round_budget(2) == 3600 and arms.queued("step_labels", 2) == (0, 192)
    assert not arms.labels("oracle") and arms.labels("interventions")


def _runs(bench):
    """Three seeds of two arms and the oracle at two budgets; held-out success on four tasks, greedy equal to sampled.
    The comparisons arm gains 25 points at the last budget in every seed, the step-label arm nothing."""
    import loop_rounds  # bench/loop_rounds.py, as bench/loop.py imported it

    finals = {
        "comparisons": [[0.5, 0.5, 0.5, 0.5], [0.75, 0.75, 0.75, 0.75]],
        "step_labels": [[0.25, 0.5, 0.25, 0.5], [0.25, 0.25, 0.5, 0.5]],
        "oracle": [[0.5, 0.75, 0.5, 0.75], [0.75, 1.0, 0.75, 0.75]],
    }
    base = [0.5, 0.5, 0.25, 0.25]
    runs = {}
    for seed in range(3):
        runs[seed] = {}
        for arm, rounds in finals.items():
            points = []
            for index, tasks in enumerate(rounds):
                # Each seed a little different, so the seeds' spread is not nil.
                tasks = [min(1.0, value + 0.05 * seed * (index == 0)) for value in tasks]
                success = sum(tasks) / len(tasks)
                gain = success - sum(base) / len(base)
                points.append(
                    asdict(
                        loop_rounds.Point(
                            round=index + 1,
                            comparisons=10 * (index + 1),
                            step_items=0,
                            greedy=success,
                            greedy_stderr=0.1,
                            sampled=success,
                            sampled_stderr=0.1,
                            policy_version=1,
                            seconds=1.0,
                            annotator_minutes=30.0 * (index + 1),
                            gains={
                                "greedy_gain": gain,
                                "greedy_gain_stderr": 0.05,
                                "sampled_gain": gain,
                                "sampled_gain_stderr": 0.05,
                            },
                            per_task={"greedy": tasks, "sampled": tasks},
                        )
                    )
                )
            runs[seed][arm] = {"base": {"greedy_success": 0.375, "sampled_success": 0.375}, "points": points}
    return runs


def test_the_report_gives_mean_gains_paired_differences_and_the_bars(bench):
    summary = bench.summarise(_runs(bench), [30.0, 60.0])
    rows = {(row["arm"], row["budget_minutes"]): row for row in summary["table"]}
    last = rows["comparisons", 60.0]
    assert last["sampled_gain"] == pytest.approx(0.375) and last["annotator_minutes"] == 60.0
    # Every seed gained the same: the seeds' spread is nil, so the held-out tasks' own error (0.05 each) stands.
    assert last["sampled_gain_stderr"] == pytest.approx(math.sqrt(3 * 0.05**2) / 3)
    first = rows["comparisons", 30.0]
    spread = math.sqrt(sum((0.05 * s - 0.05) ** 2 for s in range(3)) / 2) / math.sqrt(3)
    assert first["sampled_gain_stderr"] == pytest.approx(max(spread, math.sqrt(3 * 0.05**2) / 3))
    (difference,) = [d for d in summary["differences"] if d["budget_minutes"] == 60.0]
    assert difference["arms"] == "comparisons − step_labels"
    assert difference["sampled"] == pytest.approx(0.75 - 0.375)
    # Paired by task: differences 0.5, 0.5, 0.25, 0.25 in every seed.
    task_error = math.sqrt(sum((d - 0.375) ** 2 for d in (0.5, 0.5, 0.25, 0.25)) / 3) / 2
    assert difference["sampled_stderr"] == pytest.approx(math.sqrt(3 * task_error**2) / 3)
    verdict = summary["verdict"]
    assert verdict["best_arm"] == "comparisons"
    assert verdict["best_share_of_oracle"] == pytest.approx(0.375 / (0.8125 - 0.375))
    assert "comparisons (sampled, 60 min)" in verdict["arms_2_stderrs_over_base"]
    assert not any(entry.startswith("step_labels") for entry in verdict["arms_2_stderrs_over_base"])
    assert any(
        entry.startswith("comparisons − step_labels (sampled, 60 min)") for entry in verdict["pairs_over_2_stderrs"]
    )


def test_the_plot_draws_each_arm_from_the_base_against_annotator_minutes(bench):
    summary = bench.summarise(_runs(bench), [30.0, 60.0])
    svg = bench.chart(summary, "sampled")
    assert svg.startswith("<svg") and "annotator minutes" in svg
    for arm in ("comparisons", "step_labels", "oracle"):
        assert f'data-series="{arm}"' in svg


def test_the_printed_report_names_every_arm_and_the_verdict(bench, capsys):
    summary = bench.summarise(_runs(bench), [30.0, 60.0])
    bench.print_report(summary, {0: {"greedy_success": 0.375, "sampled_success": 0.375}})
    shown = capsys.readouterr().out
    assert "seed 0: base policy greedy 37.5%, sampled 37.5%" in shown
    assert "comparisons" in shown and "step_labels" in shown and "best_arm: comparisons" in shown


def test_one_scoring_of_the_base_policy_serves_every_arm_of_a_seed(bench):
    import argparse

    arms = bench.ArmLoop.__new__(bench.ArmLoop)
    arms.args = argparse.Namespace(arm_names=["comparisons", "mix", "oracle"])
    assert arms.base_arm == "oracle"
    arms.args.arm_names = ["step_labels", "mix"]
    assert arms.base_arm == "step_labels"

    base = {
        "greedy_success": 1.0,
        "sampled_success": 0.25,
        "greedy_per_task": [1.0, 1.0, 1.0, 1.0],
        "sampled_per_task": [0.0, 0.5, 0.5, 0.0],
    }
    per_task = {"greedy": [1.0, 1.0, 1.0, 1.0], "sampled": [1.0, 1.0, 0.5, 0.5]}
    figures = dict(round=1, comparisons=10, step_items=0, policy_version=3, seconds=1.0, per_task=per_task)
    point = bench.loop.Point(greedy=1.0, greedy_stderr=0.0, sampled=0.75, sampled_stderr=0.1, **figures)
    row = bench.with_base(point, base)
    # The gains are over the shared base, paired by task: differences 1, 0.5, 0, 0.5.
    assert row["gains"]["sampled_gain"] == pytest.approx(0.5)
    assert row["gains"]["sampled_gain_stderr"] == pytest.approx(math.sqrt(1 / 6) / 2)
    assert row["gains"]["greedy_gain"] == 0.0
    assert row["comparisons"] == 10 and row["per_task"] == point.per_task
