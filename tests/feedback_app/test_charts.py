from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
from django.utils.safestring import SafeString

from feedback_app.charts import CHAR_WIDTH, TEXT_SIZE, _fmt, bar_chart, line_chart, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def polyline_points(root: ET.Element, series: str) -> list[tuple[float, float]]:
    (line,) = [p for p in root.iter(f"{SVG}polyline") if p.get("data-series") == series]
    return [tuple(float(v) for v in pair.split(",")) for pair in line.get("points").split()]


def test_line_chart_is_safe_responsive_svg():
    svg = line_chart({"loss": [(0, 1.0), (1, 0.5)]}, title="Loss")
    assert isinstance(svg, SafeString)
    root = parse(svg)
    assert root.tag == f"{SVG}svg"
    assert root.get("width") == "100%"
    assert root.get("viewBox") == "0 0 640 240"


def test_line_chart_polyline_follows_the_data():
    data = [(0, 0.0), (1, 2.0), (2, 1.0), (3, 4.0)]
    points = polyline_points(parse(line_chart({"reward": data})), "reward")
    assert len(points) == 4
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    # x increases left to right at an even spacing for evenly spaced data.
    assert xs == sorted(xs)
    gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    assert max(gaps) - min(gaps) < 0.05
    # SVG y grows downwards: higher values sit higher on the page, in proportion.
    assert ys[1] < ys[0] and ys[2] > ys[1] and ys[3] < ys[1]
    assert (ys[0] - ys[1]) == pytest.approx((ys[0] - ys[3]) / 2, abs=0.05)


def test_line_chart_sorts_points_by_x():
    points = polyline_points(parse(line_chart({"s": [(2, 1.0), (0, 0.0), (1, 5.0)]})), "s")
    xs = [x for x, _ in points]
    assert xs == sorted(xs)
    assert min(points, key=lambda p: p[1])[0] == xs[1]  # the peak is the middle point


def test_line_chart_draws_a_dot_per_point_with_its_value_on_hover():
    root = parse(line_chart({"acc": [(0, 0.25), (10, 0.75)]}))
    dots = [c for c in root.iter(f"{SVG}circle") if c.get("data-series") == "acc"]
    assert len(dots) == 2
    assert dots[1].find(f"{SVG}title").text == "acc: 10, 0.75"


def test_line_chart_has_axes_ticks_and_legend():
    root = parse(line_chart({"a": [(0, 0), (4, 8)], "b": [(0, 1), (4, 2)]}, x_label="step", y_label="value"))
    texts = {t.get("class"): t.text for t in root.iter(f"{SVG}text") if t.get("class") in ("x-label", "y-label")}
    assert texts == {"x-label": "step", "y-label": "value"}
    y_ticks = [float(t.text) for t in root.iter(f"{SVG}text") if t.get("class") == "y-tick"]
    assert y_ticks[0] <= 0 and y_ticks[-1] >= 8
    legend = [g.get("data-series") for g in root.iter(f"{SVG}g") if g.get("class") == "legend-item"]
    assert legend == ["a", "b"]


def test_line_chart_with_no_points_says_no_data():
    for series in ({}, {"loss": []}, {"loss": [(0, math.nan)]}):
        root = parse(line_chart(series, title="Loss"))
        assert not list(root.iter(f"{SVG}polyline"))
        assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "chart-empty"] == ["No data"]


def test_line_chart_with_a_single_point_draws_one_dot_inside_the_plot():
    root = parse(line_chart({"kl": [(3, 0.2)]}))
    assert not list(root.iter(f"{SVG}polyline"))
    (dot,) = root.iter(f"{SVG}circle")
    x_min, _, width, height = (float(v) for v in root.get("viewBox").split())
    assert 0 < float(dot.get("cx")) < width and 0 < float(dot.get("cy")) < height


def test_line_chart_skips_non_finite_points():
    points = polyline_points(parse(line_chart({"s": [(0, 1.0), (1, math.inf), (2, 3.0), (math.nan, 1)]})), "s")
    assert len(points) == 2


def test_chart_text_is_escaped():
    evil = '<script>alert("x")</script>&'
    svg = line_chart({evil: [(0, 1), (1, 2)]}, title=evil, x_label=evil, y_label=evil)
    assert "<script>" not in svg
    root = parse(svg)  # still well-formed XML
    assert root.find(f"{SVG}title").text == evil
    assert [p.get("data-series") for p in root.iter(f"{SVG}polyline")] == [evil]
    bar = bar_chart([evil], {evil: [1]}, title=evil)
    assert "<script>" not in bar
    (rect,) = [r for r in parse(bar).iter(f"{SVG}rect") if r.get("data-category")]
    assert rect.get("data-category") == evil


def bars(svg: str) -> dict[tuple[str, str], dict[str, float]]:
    return {
        (r.get("data-category"), r.get("data-series")): {k: float(r.get(k)) for k in ("x", "y", "width", "height")}
        for r in parse(svg).iter(f"{SVG}rect")
        if r.get("data-category") is not None
    }


def test_stacked_bars_stack_and_scale_with_the_values():
    rects = bars(bar_chart(["mon", "tue"], {"comparison": [2, 4], "step_label": [1, 0]}))
    assert set(rects) == {("mon", "comparison"), ("mon", "step_label"), ("tue", "comparison")}  # zero: no rect
    mon_c, mon_s, tue_c = rects["mon", "comparison"], rects["mon", "step_label"], rects["tue", "comparison"]
    assert tue_c["height"] == pytest.approx(2 * mon_c["height"], abs=0.05)
    assert mon_s["height"] == pytest.approx(mon_c["height"] / 2, abs=0.05)
    # The second series sits on top of the first, in the same column.
    assert mon_s["y"] + mon_s["height"] == pytest.approx(mon_c["y"], abs=0.05)
    assert mon_s["x"] == mon_c["x"]
    assert tue_c["x"] > mon_c["x"]


def test_grouped_bars_stand_side_by_side_on_the_same_baseline():
    rects = bars(bar_chart(["a"], {"x": [3], "y": [1]}, stacked=False))
    x, y = rects["a", "x"], rects["a", "y"]
    assert y["x"] >= x["x"] + x["width"] - 0.01
    assert x["y"] + x["height"] == pytest.approx(y["y"] + y["height"], abs=0.05)
    assert x["height"] == pytest.approx(3 * y["height"], abs=0.05)


def test_negative_bars_hang_below_zero():
    rects = bars(bar_chart(["a", "b"], {"delta": [2, -2]}))
    up, down = rects["a", "delta"], rects["b", "delta"]
    assert up["y"] + up["height"] == pytest.approx(down["y"], abs=0.05)
    assert up["height"] == pytest.approx(down["height"], abs=0.05)


def test_bar_chart_rejects_a_series_of_the_wrong_length():
    with pytest.raises(ValueError, match="series 'kl': 1 values for 2 categories"):
        bar_chart(["a", "b"], {"kl": [1]})


def test_bar_chart_without_categories_says_no_data():
    root = parse(bar_chart([], {}))
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "chart-empty"] == ["No data"]


def test_many_categories_do_not_print_overlapping_labels():
    days = [f"2025-01-{d:02d}" for d in range(1, 31)]
    root = parse(bar_chart(days, {"n": list(range(30))}))
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "x-tick"]
    assert 1 < len(labels) < 30
    xs = [float(t.get("x")) for t in labels]
    assert min(b - a for a, b in zip(xs, xs[1:], strict=False)) > len(days[0]) * 6


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (-0.3, 17.2), (0.001, 0.0013), (5, 5), (0, 0), (-1e6, 3e6)])
def test_nice_ticks_cover_the_range_with_round_even_steps(lo, hi):
    ticks, (start, stop) = nice_ticks(lo, hi)
    assert start <= lo and stop >= hi and start < stop
    assert (start, stop) == (ticks[0], ticks[-1])
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(steps) == 1
    (step,) = steps
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 6) in (1, 2, 5, 10)


def test_ticks_of_a_narrow_range_far_from_zero_get_enough_digits_to_differ():
    svg = str(line_chart({"entropy": [(1, 3.36051), (2, 3.36112), (3, 3.36148)]}))
    labels = [text.text for text in ET.fromstring(svg).iter(f"{SVG}text") if text.get("class") == "y-tick"]
    assert len(labels) >= 3 and len(set(labels)) == len(labels)


def text_box(text: ET.Element) -> tuple[float, float, float, float]:
    """A tick label's rough box (left, top, right, bottom) from its anchor and its length."""
    x, y, width = float(text.get("x")), float(text.get("y")), len(text.text) * CHAR_WIDTH
    left = {"end": x - width, "middle": x - width / 2}.get(text.get("text-anchor"), x)
    return left, y - TEXT_SIZE, left + width, y


@pytest.mark.parametrize(
    "points",
    [
        [(0, 1.2e10), (1, 3.4e10), (2, 5.6e10)],  # total_flos of a small run
        [(0, 123456.7), (1, 234567.8)],
        [(10_000_000, 0.5), (12_500_000, 0.25)],  # large steps on the x axis
        [(0, 2e17), (1, 3e17)],
    ],
)
def test_tick_labels_are_short_and_inside_the_chart(points):
    root = parse(line_chart({"total_flos": points, "another series": points}, title="t"))
    width = float(root.get("viewBox").split()[2])
    ticks = [t for t in root.iter(f"{SVG}text") if t.get("class") in ("y-tick", "x-tick")]
    assert ticks and all("+" not in t.text and len(t.text) <= 8 for t in ticks)
    assert all(0 <= text_box(t)[0] and text_box(t)[2] <= width for t in ticks)
    # The legend's last row ends above the top tick label.
    legend_bottom = max(float(t.get("y")) for g in root.iter(f"{SVG}g") for t in g.iter(f"{SVG}text"))
    top_tick = min(text_box(t)[1] for t in ticks if t.get("class") == "y-tick")
    assert legend_bottom <= top_tick


def test_large_numbers_are_shortened_with_a_suffix_and_huge_ones_with_a_power_of_ten():
    assert [_fmt(v) for v in (999, 12_500, 3_100_000, 1.2e10, 4e12, 2.5e15, -2e16)] == [
        "999",
        "12.5k",
        "3.1M",
        "12G",
        "4T",
        "2.5e15",
        "-2e16",
    ]


def test_long_category_labels_are_cut_and_stay_inside_the_chart():
    names = ["a-policy-version-with-a-very-long-name-indeed", "short"]
    root = parse(bar_chart(names, {"n": [3, 4]}, width=320))
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "x-tick"]
    assert labels[0].text.endswith("…") and len(labels[0].text) <= 24
    assert all(0 <= text_box(t)[0] and text_box(t)[2] <= 320 for t in labels)
