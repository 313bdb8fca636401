"""The parts of bench/loop.py and bench/loop_seeds.py that need no server: the reward model's accuracy on the oracle
pairs, the arguments, the verdict, the plot, and the reading of several seeds together."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "loop.py"


def _load_bench(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _bench_module(name: str):
    """A module of bench/ by name, imported as the bench scripts import their helpers (bench/ on the path)."""
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def loop():
    return _load_bench(BENCH, "loop_bench")


def _bench_fixture(name: str):
    """A module-scoped fixture, named `name`, that gives the bench helper module of that name."""
    return pytest.fixture(scope="module", name=name)(lambda: _bench_module(name))


loop_rounds = _bench_fixture("loop_rounds")
loop_oracle_pairs = _bench_fixture("loop_oracle_pairs")
loop_report = _bench_fixture("loop_report")
loop_plot = _bench_fixture("loop_plot")


def test_the_oracle_pair_accuracy_is_split_by_pair_type(loop_oracle_pairs):
    won, lost = SimpleNamespace(success=True), SimpleNamespace(success=False)
    pairs = [(won, lost), (won, lost), (lost, lost), (lost, lost), (lost, lost), (won, won)]
    right = [True, True, True, False, False, True]
    shares = loop_oracle_pairs.accuracy_by_type(pairs, right)
    assert shares == {"all": 4 / 6, "one_succeeded": 1.0, "both_failed": 1 / 3, "both_succeeded": 1.0}
    assert loop_oracle_pairs.by_type_text({k: v for k, v in shares.items() if k != "all"}) == (
        "one succeeded 100%, both failed 33%, both succeeded 100%"
    )
    with pytest.raises(ValueError):  # one verdict per pair
        loop_oracle_pairs.accuracy_by_type(pairs, right[:-1])


def test_the_active_case_may_queue_fewer_comparisons_a_round(loop, capsys):
    default = loop.parse_args(["--comparisons", "250", "--samples", "4"])
    assert default.active_comparisons == 250  # as many as random
    half = loop.parse_args(["--comparisons", "250", "--samples", "4", "--active_comparisons", "125"])
    assert half.active_comparisons == 125
    with pytest.raises(SystemExit):  # 64 tasks x (3 choose 2) = 192 candidate pairs a round
        loop.parse_args(["--comparisons", "100", "--active_comparisons", "200"])
    assert "--active_comparisons: a round has only 192 candidate pairs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        loop.parse_args(["--active_comparisons", "-1"])
    assert "--active_comparisons: must be 0" in capsys.readouterr().err


def _point(loop_rounds, number, comparisons, sampled, greedy, judges):
    """One round of a case, as bench/loop.py records it (the standard errors are placeholders)."""
    return loop_rounds.Point(
        round=number,
        comparisons=comparisons,
        step_items=0,
        greedy=greedy,
        greedy_stderr=0.035,
        sampled=sampled,
        sampled_stderr=0.035,
        policy_version=number,
        seconds=1.0,
        judges=judges,
        gains={"sampled_gain_stderr": 0.04, "greedy_gain_stderr": 0.03},
    )


def _rounds(loop_rounds, rounds):
    """A case's points from (comparisons, sampled, greedy, reward-model accuracy) a round."""
    return [
        _point(loop_rounds, number, comparisons, sampled, greedy, {"rm_oracle_accuracy": accuracy} if accuracy else {})
        for number, (comparisons, sampled, greedy, accuracy) in enumerate(rounds, start=1)
    ]


def test_the_verdict_compares_active_at_half_the_labels_with_random(loop_rounds, loop_report, capsys):
    base = {"sampled_success": 0.50, "greedy_success": 0.40}
    results = {
        "random": (base, _rounds(loop_rounds, [(250, 0.52, 0.40, 0.74), (500, 0.56, 0.41, 0.77)])),
        "active": (base, _rounds(loop_rounds, [(125, 0.53, 0.40, 0.78), (250, 0.57, 0.38, 0.80)])),
        "oracle": (base, _rounds(loop_rounds, [(0, 0.55, 0.40, None), (0, 0.60, 0.40, None)])),
    }
    verdict = loop_report.report(results, SimpleNamespace(eval_tasks=200, eval_samples=4))
    assert verdict["sampled"]["active_minus_random"] == pytest.approx(0.01)
    assert verdict["greedy"]["active_minus_random"] == pytest.approx(-0.03)
    assert verdict["sampled"]["labels_for_random_gain"] == {"random": 500, "active": 250}
    assert verdict["sampled"]["random_fraction_of_oracle"] == pytest.approx(0.6)
    printed = capsys.readouterr().out
    assert "comparisons to reach random's final gain: random 500, active 250" in printed
    assert "active (250 comparisons) minus random (500): +1.0%" in printed
    # Active's reward model passed random's last accuracy (77 %) after its first 125 comparisons.
    assert verdict["reward_model"]["comparisons_for_random_final_accuracy"] == {"random": 500, "active": 125}


def test_without_the_oracle_case_the_verdict_still_compares_active_with_random(loop_rounds, loop_report, capsys):
    base = {"sampled_success": 0.50, "greedy_success": 0.40}
    results = {
        "random": (base, _rounds(loop_rounds, [(24, 0.49, 0.38, 0.70), (48, 0.55, 0.41, 0.73)])),
        "active": (base, _rounds(loop_rounds, [(12, 0.51, 0.40, 0.72), (24, 0.56, 0.37, 0.71)])),
    }
    verdict = loop_report.report(results, SimpleNamespace(eval_tasks=200, eval_samples=4))
    assert verdict["sampled"]["active_minus_random"] == pytest.approx(0.01)
    assert verdict["greedy"]["active_minus_random"] == pytest.approx(-0.04)
    assert verdict["sampled"]["labels_for_random_gain"] == {"random": 48, "active": 24}
    assert "oracle_gain" not in verdict["sampled"] and "random_fraction_of_oracle" not in verdict["sampled"]
    printed = capsys.readouterr().out
    assert "sampled: random +5.0% ± 4.0%; active +6.0% ± 4.0%; comparisons to reach random's final gain: " in printed
    assert "active (24 comparisons) minus random (48): +1.0%" in printed
    assert "greedy: random +1.0% ± 3.0%; active -3.0% ± 3.0%;" in printed


def test_the_plot_is_written_as_svg_and_as_a_png_rendered_by_chromium(loop_rounds, loop_plot, tmp_path, capsys):
    import struct

    if loop_plot.find_chromium() is None:
        pytest.skip("needs Chromium (CI installs Debian's chromium)")
    base = {"sampled_success": 0.50, "greedy_success": 0.40}
    results = {
        "random": (base, [_point(loop_rounds, 1, 100, 0.55, 0.41, {}), _point(loop_rounds, 2, 200, 0.58, 0.39, {})]),
        "oracle": (base, [_point(loop_rounds, 1, 0, 0.56, 0.42, {}), _point(loop_rounds, 2, 0, 0.60, 0.43, {})]),
    }
    png = tmp_path / "loop.png"
    loop_plot.plot(results, png)
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1180, 400)  # IHDR: the two charts side by side
    sampled = (tmp_path / "loop-sampled.svg").read_text()
    assert "random queries" in sampled and "oracle reward (PPO, final)" in sampled
    assert (tmp_path / "loop-greedy.svg").exists()
    assert f"plot: {png} (and " in capsys.readouterr().out


def test_without_a_runnable_chromium_the_plot_says_why_there_is_no_png(
    loop_rounds, loop_plot, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(loop_plot.shutil, "which", lambda name: None)
    base = {"sampled_success": 0.50, "greedy_success": 0.40}
    results = {"random": (base, [_point(loop_rounds, 1, 100, 0.55, 0.41, {})])}
    charts = loop_plot.plot(results, tmp_path / "loop.png")
    assert not (tmp_path / "loop.png").exists()
    # The figures carry the same SVGs, for the benchmark page.
    assert charts == {decoding: (tmp_path / f"loop-{decoding}.svg").read_text() for decoding in ("sampled", "greedy")}
    assert "(no PNG: Chromium is not installed (Debian: apt-get install chromium))" in capsys.readouterr().out
    broken = tmp_path / "chromium"
    broken.write_text("not a program")  # on PATH, but without the execute bit
    monkeypatch.setattr(loop_plot.shutil, "which", lambda name: str(broken))
    loop_plot.plot(results, tmp_path / "loop.png")
    assert f"(no PNG: {broken} could not be started: " in capsys.readouterr().out


SEEDS_BENCH = BENCH.with_name("loop_seeds.py")


@pytest.fixture(scope="module")
def loop_seeds():
    return _load_bench(SEEDS_BENCH, "loop_seeds_bench")


def _figures(loop_rounds, tmp_path, name, seed, base, cases):
    """A bench/loop.py --out file: `cases` maps a case to its rounds' (comparisons, sampled, greedy)."""
    import json
    from dataclasses import asdict

    judges = {"rm_oracle_accuracy": 0.75, "rm_oracle_accuracy_by_type": {"one_succeeded": 0.9, "both_failed": 0.5}}

    def point(number, comparisons, sampled, greedy):
        return _point(loop_rounds, number, comparisons, sampled, greedy, judges)

    path = tmp_path / name
    base_figures = {"sampled_success": base[0], "greedy_success": base[1]}
    path.write_text(
        json.dumps(
            {
                "settings": {"seed": seed},
                "cases": {
                    case: {"base": base_figures, "points": [asdict(point(i + 1, *r)) for i, r in enumerate(rounds)]}
                    for case, rounds in cases.items()
                },
            }
        )
    )
    return path


def test_loop_seeds_reads_the_bars_on_the_means_over_seeds(loop_rounds, loop_seeds, tmp_path, capsys):
    files = [
        _figures(
            loop_rounds,
            tmp_path,
            "s1.json",
            1,
            (0.50, 0.40),
            {
                "random": [(100, 0.52, 0.41), (200, 0.56, 0.40)],
                "active": [(100, 0.56, 0.40), (200, 0.55, 0.44)],
            },
        ),
        # Seed 1's oracle case from another run on the same base policy.
        _figures(
            loop_rounds, tmp_path, "s1-oracle.json", 1, (0.50, 0.40), {"oracle": [(0, 0.54, 0.40), (0, 0.58, 0.42)]}
        ),
        _figures(
            loop_rounds,
            tmp_path,
            "s2.json",
            2,
            (0.40, 0.30),
            {
                "oracle": [(0, 0.42, 0.30), (0, 0.44, 0.30)],
                "random": [(100, 0.40, 0.32), (200, 0.44, 0.30)],
                "active": [(100, 0.44, 0.30), (200, 0.40, 0.28)],
            },
        ),
    ]
    seeds = loop_seeds.load(files)
    summary = loop_seeds.summarise(seeds)
    sampled = {case: summary["cases"][case]["sampled"] for case in ("oracle", "random", "active")}
    assert summary["seeds"] == [1, 2]
    assert sampled["oracle"]["final_gains"] == pytest.approx([0.08, 0.04])
    assert sampled["random"]["mean"] == pytest.approx(0.05)
    assert sampled["random"]["stderr"] == pytest.approx(0.01)
    assert sampled["random"]["share_of_oracle"] == pytest.approx(0.05 / 0.06)
    assert sampled["active"]["share_of_oracle"] == pytest.approx(0.025 / 0.06)
    assert sampled["active"]["mean_per_round"] == pytest.approx([0.05, 0.025])
    # Active's mean curve passes random's final mean gain (+5 points) after its first 100 comparisons.
    assert summary["labels_for_random_mean_gain"]["sampled"] == {"random": 200, "active": 100}
    # Random's greedy mean gain is nil: there is nothing to match, so no count for either case.
    assert summary["labels_for_random_mean_gain"]["greedy"] == {"random": None, "active": None}
    assert summary["cases"]["active"]["greedy"]["share_of_oracle"] == pytest.approx(1.0)
    assert summary["cases"]["random"]["rm_last_round_by_type"] == {"one_succeeded": 0.9, "both_failed": 0.5}
    assert summary["cases"]["active"]["rm_last_round"] == pytest.approx(0.75)
    loop_seeds.report(seeds, summary)
    printed = capsys.readouterr().out
    assert "random: mean gain as a share of the oracle's mean gain: sampled 83%, greedy 0%" in printed
    assert "sampled: comparisons for random's final mean gain (+5.0): random 200, active 100" in printed
    assert "oracle (seeds 1, 2): round 1: +3.0 / +0.0, round 2: +6.0 / +1.0" in printed
    assert "random (seeds 1, 2): 100: +1.0 / +1.5, 200: +5.0 / +0.0" in printed
    assert "active: reward model on the oracle pairs after the last round, mean over seeds: all 75.0%, one " in printed
    # Seed 1: active +5 against random +6 sampled; seed 2: 0 against +4.
    difference = summary["active_minus_random"]
    assert difference["sampled"]["differences"] == pytest.approx([-0.01, -0.04])
    assert difference["sampled"]["mean"] == pytest.approx(-0.025)
    assert difference["sampled"]["stderr"] == pytest.approx(0.015)
    assert difference["greedy"]["differences"] == pytest.approx([0.04, -0.02])
    assert (
        "active's final gain (200 comparisons) minus random's (200), seed by seed, mean over seeds 1, 2: "
        "-2.5 ± 1.5 / +1.0 ± 3.0 (sampled / greedy)" in printed
    )


def test_loop_seeds_compares_active_at_half_the_labels_with_random_seed_by_seed(
    loop_rounds, loop_seeds, tmp_path, capsys
):
    """`--active_comparisons` half of `--comparisons`: the same rounds, half the labels; a seed without both cases
    is left out of the difference."""
    files = [
        _figures(
            loop_rounds,
            tmp_path,
            f"s{seed}.json",
            seed,
            (0.50, 0.40),
            {"random": [(200, 0.52, 0.40), (400, 0.56, 0.40)], "active": [(100, 0.53, 0.41), (200, active, 0.42)]},
        )
        for seed, active in ((1, 0.57), (2, 0.55))
    ]
    files.append(
        _figures(loop_rounds, tmp_path, "s3.json", 3, (0.50, 0.40), {"random": [(200, 0.5, 0.4), (400, 0.6, 0.4)]})
    )
    seeds = loop_seeds.load(files)
    summary = loop_seeds.summarise(seeds)
    difference = summary["active_minus_random"]
    assert difference["seeds"] == [1, 2]
    assert difference["comparisons"] == {"active": 200, "random": 400}
    assert difference["sampled"]["differences"] == pytest.approx([0.01, -0.01])
    assert difference["sampled"]["mean"] == pytest.approx(0.0)
    assert difference["greedy"]["mean"] == pytest.approx(0.02)
    # On the mean curves (random's over seeds 1-3) active never reaches random's final +7.3 points.
    assert summary["labels_for_random_mean_gain"]["sampled"] == {"random": 400, "active": None}
    loop_seeds.report(seeds, summary)
    assert "active's final gain (200 comparisons) minus random's (400), seed by seed, mean over seeds 1, 2: " in (
        capsys.readouterr().out
    )


def test_loop_seeds_refuses_one_seed_on_two_base_policies_and_unequal_schedules(loop_rounds, loop_seeds, tmp_path):
    one = _figures(loop_rounds, tmp_path, "a.json", 3, (0.50, 0.40), {"random": [(100, 0.5, 0.4)]})
    other_base = _figures(loop_rounds, tmp_path, "b.json", 3, (0.45, 0.40), {"oracle": [(0, 0.5, 0.4)]})
    with pytest.raises(SystemExit, match="seed 3's oracle case started from a base policy"):
        loop_seeds.load([one, other_base])
    longer = _figures(loop_rounds, tmp_path, "c.json", 4, (0.50, 0.40), {"random": [(250, 0.5, 0.4)]})
    with pytest.raises(SystemExit, match="the random case labelled on different schedules"):
        loop_seeds.summarise(loop_seeds.load([one, longer]))
    # Random at seed 3 and the oracle at seed 5 only: no seed ran both, so there is no share of the oracle's gain.
    elsewhere = _figures(loop_rounds, tmp_path, "d.json", 5, (0.50, 0.40), {"oracle": [(0, 0.6, 0.4)]})
    apart = loop_seeds.summarise(loop_seeds.load([one, elsewhere]))
    assert "share_of_oracle" not in apart["cases"]["random"]["sampled"]
    assert apart["cases"]["oracle"]["sampled"]["mean"] == pytest.approx(0.1)
    assert apart["cases"]["oracle"]["sampled"]["stderr"] is None  # one seed: no spread across seeds
    (tmp_path / "no-base.json").write_text('{"settings": {"seed": 6}, "cases": {"random": {"points": []}}}')
    with pytest.raises(SystemExit, match="the random case has no base policy figures"):
        loop_seeds.load([tmp_path / "no-base.json"])
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a bench/loop.py figures file"):
        loop_seeds.load([tmp_path / "junk.json"])
