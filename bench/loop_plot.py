"""The plot of bench/loop.py: held-out success against the labels, drawn as SVG by the dashboard's chart module
and rendered to PNG by a headless Chromium (which bench/feedback_types.py uses for its plot too)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from loop_rounds import Point


def plot(results: dict[str, tuple[dict[str, Any], list[Point]]], path: Path) -> dict[str, str]:
    """Held-out success against comparisons, sampled and greedy side by side, as SVG from the dashboard's chart
    module, and a PNG of the two rendered by Chromium (when it is installed). Returns the SVGs by decoding, which the
    figures carry for the benchmark page."""
    from feedback_app.charts import line_chart

    base = next(iter(results.values()))[0]
    largest = max((p.comparisons for _, points in results.values() for p in points), default=0) or 1
    charts = []
    for decoding in ("sampled", "greedy"):
        series: dict[str, list[tuple[float, float]]] = {}
        for case, (_, points) in results.items():
            if case == "oracle":  # no labels: its final success is drawn flat across the label axis
                final = 100 * getattr(points[-1], decoding)
                series["oracle reward (PPO, final)"] = [(0.0, final), (float(largest), final)]
            else:
                start = (0.0, 100 * base.get(f"{decoding}_success", 0.0))
                series[f"{case} queries"] = [
                    start,
                    *((float(p.comparisons), 100 * getattr(p, decoding)) for p in points),
                ]
        charts.append(
            line_chart(
                series,
                title=f"Held-out success, {decoding} decoding",
                x_label="comparisons labelled",
                y_label="success (%)",
                width=560,
                height=360,
            )
        )
    html = "".join(f"<div style='width:560px;display:inline-block;margin:8px'>{chart}</div>" for chart in charts)
    path.parent.mkdir(parents=True, exist_ok=True)
    svg_paths = []
    for decoding, chart in zip(("sampled", "greedy"), charts, strict=True):
        svg_paths.append(path.with_name(f"{path.stem}-{decoding}.svg"))
        svg_paths[-1].write_text(str(chart))
    try:
        render_png(html, path, width=1180, height=400)
        print(f"plot: {path} (and {', '.join(map(str, svg_paths))})")
    except RuntimeError as exc:  # no Chromium, or it failed: the SVGs are the plot
        print(f"plot: {', '.join(map(str, svg_paths))} (no PNG: {exc})")
    return {decoding: str(chart) for decoding, chart in zip(("sampled", "greedy"), charts, strict=True)}


def find_chromium() -> str | None:
    """The Chromium (or Chrome) on PATH, by the names Debian and others install it under."""
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def render_png(body: str, path: Path, width: int, height: int) -> None:
    """Screenshots `body` (HTML) into the PNG `path` with Chromium's own headless mode: the browser alone, no Python
    package (Playwright is a test extra, and `./run.sh` does not install it). RuntimeError says why it could not."""
    browser = find_chromium()
    if browser is None:
        raise RuntimeError("Chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "plot.html"
        page.write_text(f"<html><body style='margin:0;background:#fff;white-space:nowrap'>{body}</body></html>")
        path.unlink(missing_ok=True)
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # as root (containers, CI) Chromium refuses to start with its sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={scratch}/profile",
            f"--window-size={width},{height}",
            f"--screenshot={path.resolve()}",
            page.as_uri(),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{browser} did not finish the screenshot in {exc.timeout:.0f} s") from exc
        except OSError as exc:  # found on PATH but not runnable
            raise RuntimeError(f"{browser} could not be started: {exc}") from exc
    if done.returncode != 0 or not path.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{browser} exited with {done.returncode} and wrote no PNG: {last[:200]}")
