"""Charts as server-rendered inline SVG: no JavaScript, no CDN, no charting library.

A chart is a string of SVG markup (a `SafeString`, so a template can print it as it is). Every piece of text that
comes from data (titles, axis labels, series and category names) is escaped here. The SVG carries a `viewBox` and
`width="100%"`, so it scales to its container on a laptop or a phone; colours are attributes, not CSS, so a chart
reads the same wherever it is pasted.

    >>> svg = line_chart({"loss": [(0, 1.0), (1, 0.6), (2, 0.4)]}, title="Loss", x_label="step")
    >>> svg.startswith("<svg")
    True

Each mark carries `data-series` (and bars `data-category`) plus a `<title>` with its value, which a browser shows
on hover; tests read the geometry back with `xml.etree`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypedDict, Unpack

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
FONT = 'font-family="system-ui, sans-serif"'
TEXT_SIZE = 12
CHAR_WIDTH = 6.6  # rough width of one character at TEXT_SIZE, for laying out legends and skipping tick labels
LEGEND_ROW = 18
MARGIN_LEFT = 56
MARGIN_RIGHT = 16
# Points are drawn as dots up to this many per series; beyond it a dot per point is noise and page weight.
MAX_DOTS = 80
# Category labels under bars are cut to this many characters.
LONGEST_CATEGORY = 24


class Layout(TypedDict, total=False):
    """The keywords `line_chart` and `bar_chart` take: a `title` over the chart, `x_label` and `y_label` along its
    axes (none unless given), and its `width` and `height` in SVG units (640 by 240 unless given; the SVG scales to
    its container)."""

    title: str
    x_label: str
    y_label: str
    width: int
    height: int


def line_chart(series: dict[str, Sequence[tuple[float, float]]], **layout: Unpack[Layout]) -> SafeString:
    """One polyline per series over numeric x. Points that are not finite numbers are left out; a series with one
    point is a dot; no points at all gives a frame that says "No data"."""
    clean = {str(name): _finite_points(points) for name, points in series.items()}
    xs = [x for points in clean.values() for x, _ in points]
    ys = [y for points in clean.values() for _, y in points]
    frame = _Frame(list(clean), **layout)
    if not xs:
        return frame.render(frame.empty())
    x_ticks, (x_lo, x_hi) = nice_ticks(min(xs), max(xs))
    y_ticks, (y_lo, y_hi) = nice_ticks(min(ys), max(ys))
    frame.fit_ticks(y_ticks, x_ticks)
    sx = _scale(x_lo, x_hi, frame.left, frame.right)
    sy = _scale(y_lo, y_hi, frame.bottom, frame.top)
    parts = [frame.y_axis(y_ticks, sy), frame.x_axis_numeric(x_ticks, sx)]
    for index, (name, points) in enumerate(clean.items()):
        colour = PALETTE[index % len(PALETTE)]
        points = sorted(points)
        coords = [(sx(x), sy(y)) for x, y in points]
        if len(coords) > 1:
            path = " ".join(f"{_n(cx)},{_n(cy)}" for cx, cy in coords)
            parts.append(
                f'<polyline data-series="{escape(name)}" points="{path}" fill="none" stroke="{colour}" '
                f'stroke-width="2" stroke-linejoin="round"/>'
            )
        if len(coords) <= MAX_DOTS:
            for (x, y), (cx, cy) in zip(points, coords, strict=True):
                parts.append(
                    f'<circle data-series="{escape(name)}" cx="{_n(cx)}" cy="{_n(cy)}" r="3" fill="{colour}">'
                    f"<title>{escape(name)}: {_fmt(x)}, {_fmt(y)}</title></circle>"
                )
    return frame.render("".join(parts))


def bar_chart(
    categories: Sequence[str], series: dict[str, Sequence[float]], *, stacked: bool = True, **layout: Unpack[Layout]
) -> SafeString:
    """Bars per category, one colour per series, stacked or side by side. Every series has one value per category
    (ValueError naming the series otherwise); a value that is not a finite number counts as 0. Stacks grow up from
    0 for positive values and down for negative ones."""
    categories = [str(c) for c in categories]
    values: dict[str, list[float]] = {}
    for name, row in series.items():
        if len(row) != len(categories):
            raise ValueError(f"series {name!r}: {len(row)} values for {len(categories)} categories")
        values[str(name)] = [float(v) if _is_finite(v) else 0.0 for v in row]
    frame = _Frame(list(values), **layout)
    if not categories or not values:
        return frame.render(frame.empty())

    # Each bar segment is (category index, series index, start, end) in data units.
    segments: list[tuple[int, int, float, float]] = []
    for c in range(len(categories)):
        up = down = 0.0
        for s, row in enumerate(values.values()):
            v = row[c]
            if not stacked:
                segments.append((c, s, 0.0, v))
            elif v >= 0:
                segments.append((c, s, up, up + v))
                up += v
            else:
                segments.append((c, s, down, down + v))
                down += v
    ends = [end for *_, end in segments]
    y_ticks, (y_lo, y_hi) = nice_ticks(min(0.0, *ends), max(0.0, *ends))
    frame.fit_ticks(y_ticks)
    sy = _scale(y_lo, y_hi, frame.bottom, frame.top)
    band = (frame.right - frame.left) / len(categories)
    bar_width = band * 0.8 if stacked else band * 0.8 / len(values)
    parts = [frame.y_axis(y_ticks, sy), frame.x_axis_categories(categories, band)]
    names = list(values)
    for c, s, start, end in segments:
        if start == end:
            continue
        x = frame.left + band * c + band * 0.1 + (0 if stacked else s * bar_width)
        top, bottom = sorted((sy(start), sy(end)))
        name = names[s]
        parts.append(
            f'<rect data-series="{escape(name)}" data-category="{escape(categories[c])}" x="{_n(x)}" '
            f'y="{_n(top)}" width="{_n(bar_width)}" height="{_n(bottom - top)}" '
            f'fill="{PALETTE[s % len(PALETTE)]}"><title>{escape(categories[c])} · {escape(name)}: '
            f"{_fmt(end - start)}</title></rect>"
        )
    if y_lo < 0 < y_hi:
        parts.append(_line(frame.left, sy(0), frame.right, sy(0), "#6b7385"))
    return frame.render("".join(parts))


def interval_chart(
    rows: Sequence[tuple[str, float, float, float]],
    *,
    title: str = "",
    x_label: str = "",
    width: int = 640,
    reference: float | None = 0.0,
) -> SafeString:
    """Estimates with intervals, one row each, as a dot on a whisker (a forest plot): ``(label, value, low, high)``.
    The height follows the number of rows; a vertical line marks `reference` (None for none)."""
    rows = [(str(label), float(v), float(lo), float(hi)) for label, v, lo, hi in rows if _is_finite(v)]
    row_height = 24
    label_width = min(200, 16 + CHAR_WIDTH * max((len(label) for label, *_ in rows), default=4))
    frame = _Frame([""], title=title, x_label=x_label, width=width, height=0)
    frame.height = int(frame.top + row_height * max(len(rows), 1) + (42 if x_label else 26))
    frame.bottom = frame.height - (42 if x_label else 26)
    frame.left = label_width
    if not rows:
        return frame.render(frame.empty())
    values = [v for _, *triple in rows for v in triple if _is_finite(v)]
    if reference is not None:
        values.append(reference)
    x_ticks, (x_lo, x_hi) = nice_ticks(min(values), max(values))
    frame.fit_ticks([], x_ticks)
    sx = _scale(x_lo, x_hi, frame.left, frame.right)
    parts = [frame.x_axis_numeric(x_ticks, sx)]
    if reference is not None:
        parts.append(_line(sx(reference), frame.top, sx(reference), frame.bottom, "#dde1e8"))
    for index, (label, value, low, high) in enumerate(rows):
        y = frame.top + row_height * (index + 0.5)
        shown = label if len(label) <= 28 else label[:27] + "…"
        parts.append(
            f'<g class="interval" data-label="{escape(label)}"><title>{escape(label)}: {_fmt(value)} '
            f"[{_fmt(low)}, {_fmt(high)}]</title>"
            f'<text x="{_n(frame.left - 8)}" y="{_n(y + 4)}" text-anchor="end">{escape(shown)}</text>'
            f'<line x1="{_n(sx(low))}" y1="{_n(y)}" x2="{_n(sx(high))}" y2="{_n(y)}" stroke="{PALETTE[0]}" '
            f'stroke-width="2"/><circle cx="{_n(sx(value))}" cy="{_n(y)}" r="4" fill="{PALETTE[0]}"/></g>'
        )
    return frame.render("".join(parts))


def nice_ticks(lo: float, hi: float, count: int = 5) -> tuple[list[float], tuple[float, float]]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten), and the domain they span.
    A zero-width range is widened so a single value sits in the middle of the axis."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.5 if lo else 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * 0.999)
    start = math.floor(lo / step + 1e-9) * step
    stop = math.ceil(hi / step - 1e-9) * step
    ticks = [round(start + i * step, 12) + 0.0 for i in range(int(round((stop - start) / step)) + 1)]
    return ticks, (ticks[0], ticks[-1])


class _Frame:
    """The chart's box: title and legend on top, the y axis on the left, the x axis below."""

    def __init__(
        self,
        names: list[str],
        *,
        title: str = "",
        x_label: str = "",
        y_label: str = "",
        width: int = 640,
        height: int = 240,
    ):
        """A frame for the series `names` (a legend entry each), laid out by the `Layout` keywords."""
        self.width, self.height = int(width), int(height)
        self.title, self.names, self.x_label, self.y_label = str(title), names, str(x_label), str(y_label)
        self.legend = self._legend_layout()
        legend_rows = 1 + max((row for row, _, _ in self.legend), default=-1)
        # Half a line below the legend, so the top tick's label (centred on the plot's top edge) stays clear of it.
        self.top = 10 + (22 if self.title else 0) + LEGEND_ROW * legend_rows + (TEXT_SIZE // 2 if legend_rows else 0)
        self.bottom = self.height - (42 if self.x_label else 26)
        self.left = MARGIN_LEFT if self.y_label else MARGIN_LEFT - 16
        self.right = self.width - MARGIN_RIGHT

    def fit_ticks(self, y_ticks: Sequence[float], x_ticks: Sequence[float] = ()) -> None:
        """Widen the left margin to the widest y tick label, and the right one to half the last x tick label, so
        that no label is cut off at the edge of the chart."""
        if y_ticks:
            widest = max(len(label) for label in _tick_labels(list(y_ticks))) * CHAR_WIDTH + 10
            self.left = max(self.left, widest + (16 if self.y_label else 0))
        if x_ticks:
            last = _tick_labels(list(x_ticks))[-1]
            self.right = min(self.right, self.width - len(last) * CHAR_WIDTH / 2 - 2)

    def _legend_layout(self) -> list[tuple[int, float, str]]:
        """(row, x, name) per series, wrapping onto new rows so a narrow chart keeps its legend readable. A lone
        unnamed series needs no legend."""
        if len(self.names) == 1 and not self.names[0]:
            return []
        layout, row, x = [], 0, 8.0
        for name in self.names:
            item = 16 + CHAR_WIDTH * len(name) + 14
            if x + item > self.width - 8 and x > 8:
                row, x = row + 1, 8.0
            layout.append((row, x, name))
            x += item
        return layout

    def render(self, body: str) -> SafeString:
        head = [
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {self.width} {self.height}" '
            f'width="100%" preserveAspectRatio="xMidYMid meet" role="img" aria-label="{escape(self.title or "chart")}"'
            f' {FONT} font-size="{TEXT_SIZE}">'
        ]
        if self.title:
            head.append(f"<title>{escape(self.title)}</title>")
            head.append(
                f'<text class="chart-title" x="8" y="22" font-weight="600" font-size="14">{escape(self.title)}</text>'
            )
        legend_top = 10 + (22 if self.title else 0)
        for index, (row, x, name) in enumerate(self.legend):
            y = legend_top + row * LEGEND_ROW
            head.append(
                f'<g class="legend-item" data-series="{escape(name)}"><rect x="{_n(x)}" y="{_n(y + 3)}" width="10" '
                f'height="10" fill="{PALETTE[index % len(PALETTE)]}"/><text x="{_n(x + 14)}" y="{_n(y + 12)}">'
                f"{escape(name)}</text></g>"
            )
        if self.x_label:
            head.append(
                f'<text class="x-label" x="{_n((self.left + self.right) / 2)}" y="{self.height - 6}" '
                f'text-anchor="middle" fill="#6b7385">{escape(self.x_label)}</text>'
            )
        if self.y_label:
            middle = _n((self.top + self.bottom) / 2)
            head.append(
                f'<text class="y-label" x="12" y="{middle}" transform="rotate(-90 12 {middle})" text-anchor="middle" '
                f'fill="#6b7385">{escape(self.y_label)}</text>'
            )
        return mark_safe("".join(head) + body + "</svg>")

    def empty(self) -> str:
        return (
            f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" height="{self.bottom - self.top}"'
            f' fill="none" stroke="#dde1e8"/><text class="chart-empty" x="{_n((self.left + self.right) / 2)}" '
            f'y="{_n((self.top + self.bottom) / 2)}" text-anchor="middle" fill="#6b7385">No data</text>'
        )

    def y_axis(self, ticks: list[float], sy) -> str:
        parts = [_line(self.left, self.top, self.left, self.bottom, "#6b7385")]
        for tick, label in zip(ticks, _tick_labels(ticks), strict=True):
            y = sy(tick)
            parts.append(_line(self.left, y, self.right, y, "#eef0f4"))
            parts.append(f'<text class="y-tick" x="{self.left - 6}" y="{_n(y + 4)}" text-anchor="end">{label}</text>')
        return "".join(parts)

    def x_axis_numeric(self, ticks: list[float], sx) -> str:
        parts = [_line(self.left, self.bottom, self.right, self.bottom, "#6b7385")]
        for tick, label in zip(ticks, _tick_labels(ticks), strict=True):
            x = sx(tick)
            parts.append(_line(x, self.bottom, x, self.bottom + 4, "#6b7385"))
            parts.append(
                f'<text class="x-tick" x="{_n(x)}" y="{self.bottom + 16}" text-anchor="middle">{label}</text>'
            )
        return "".join(parts)

    def x_axis_categories(self, categories: list[str], band: float) -> str:
        parts = [_line(self.left, self.bottom, self.right, self.bottom, "#6b7385")]
        # Label every k-th category so that labels never overlap; the rest still show on hover.
        # A label longer than LONGEST_CATEGORY characters is cut with an ellipsis (its bar's tooltip has it whole),
        # and none reaches past the chart's edges.
        shown = [c if len(c) <= LONGEST_CATEGORY else c[: LONGEST_CATEGORY - 1] + "…" for c in categories]
        widest = max(len(c) for c in shown) * CHAR_WIDTH + 6
        every = max(1, math.ceil(widest / band))
        for index, category in enumerate(shown):
            if index % every:
                continue
            half = len(category) * CHAR_WIDTH / 2
            x = min(max(self.left + band * (index + 0.5), half + 2), self.width - half - 2)
            parts.append(
                f'<text class="x-tick" x="{_n(x)}" y="{self.bottom + 16}" text-anchor="middle">'
                f"{escape(category)}</text>"
            )
        return "".join(parts)


def _finite_points(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points if _is_finite(x) and _is_finite(y)]


def _is_finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _scale(lo: float, hi: float, out_lo: float, out_hi: float):
    span = hi - lo
    return lambda v: out_lo + (v - lo) / span * (out_hi - out_lo)


def _line(x1: float, y1: float, x2: float, y2: float, colour: str) -> str:
    return f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{colour}" stroke-width="1"/>'


def _n(value: float) -> str:
    """A coordinate, short: two decimals are finer than any screen pixel of a chart this size."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


# Suffixes of large numbers, largest first; past the last, a number is written with its power of ten.
SCALES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k"))


def _fmt(value: float, digits: int = 4) -> str:
    """A number for people: up to `digits` significant digits, thousands to trillions shortened (12.5k, 3.1G), and
    anything larger written as 2.5e15."""
    size = abs(value)
    if size >= 1e15:
        mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
        return f"{float(mantissa):.{digits}g}e{int(exponent)}"
    for scale, suffix in SCALES:
        if size >= scale:
            divisor = 1e3 if suffix == "k" else scale
            return f"{value / divisor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def _tick_labels(ticks: list[float]) -> list[str]:
    """Tick labels with as few significant digits (at least four) as tell the ticks apart: a narrow range far from
    zero (an entropy of 3.3605 to 3.3615) needs more than four."""
    for digits in range(4, 13):
        labels = [_fmt(tick, digits) for tick in ticks]
        if len(set(labels)) == len(labels):
            return labels
    return labels
