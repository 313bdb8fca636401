"""The model registry's lineage graph as server-rendered SVG: which snapshot and which parent produced which version.

Nodes are snapshots, runs, policy versions and judge models; edges point from what was used to what was made
(snapshot -> run, base policy -> run, judge model -> run, run -> policy version or judge model, and parent ->
child for a version whose parent is not its run's base). The layout is layered: a node's column is the length of
the longest path that reaches it, so every edge points rightwards, and a source sits just before the first node it
feeds. Within a column nodes sit in the order of the mean row of their predecessors (one barycentre sweep), which
keeps a chain of versions on one line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

NODE_WIDTH = 156
NODE_HEIGHT = 44
COLUMN_GAP = 44
ROW_GAP = 16
PAD = 8
FILL = {"snapshot": "#fef3c7", "run": "#e0e7ff", "policy": "#dcfce7", "model": "#fae8ff"}
KIND_NAMES = {"snapshot": "snapshot", "run": "run", "policy": "policy version", "model": "judge model"}
MAX_LABEL = 22
MAX_DETAIL = 26


@dataclass(frozen=True)
class Node:
    key: str
    kind: str  # snapshot, run, policy or model
    label: str
    detail: str = ""
    href: str = ""
    failed: bool = False


def layered_layout(nodes: Sequence[Node], edges: Sequence[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """(column, row) per node key. Edges that would close a cycle or name unknown nodes are ignored."""
    keys = [node.key for node in nodes]
    known = set(keys)
    successors: defaultdict[str, list[str]] = defaultdict(list)
    for source, target in edges:
        if source in known and target in known and source != target:
            successors[source].append(target)
    column: dict[str, int] = {}
    # Longest path by depth-first search from each node; a node on the current path is a cycle and is skipped.
    on_path: set[str] = set()

    def depth_of(key: str) -> None:
        on_path.add(key)
        for target in successors[key]:
            if target in on_path:
                continue
            if column.get(target, -1) < column[key] + 1:
                column[target] = column[key] + 1
                depth_of(target)
        on_path.discard(key)

    has_predecessor = {target for targets in successors.values() for target in targets}
    for key in keys:
        if key not in has_predecessor:
            column.setdefault(key, 0)
            depth_of(key)
    for key in keys:  # nodes only reachable through a cycle
        if key not in column:
            column[key] = 0
            depth_of(key)
    # A source sits just before the first node it feeds, not in column 0: a base policy goes right beside the run
    # that fine-tunes it instead of sending a long edge across the graph.
    for key in keys:
        if key not in has_predecessor and successors[key]:
            column[key] = min(column[target] for target in successors[key]) - 1

    predecessors: defaultdict[str, list[str]] = defaultdict(list)
    for source, targets in successors.items():
        for target in targets:
            if column[target] > column[source]:
                predecessors[target].append(source)
    order = {key: i for i, key in enumerate(keys)}
    by_column: defaultdict[int, list[str]] = defaultdict(list)
    for key in keys:
        by_column[column[key]].append(key)
    row: dict[str, int] = {}
    for col in sorted(by_column):
        members = by_column[col]

        def barycentre(key: str) -> tuple[float, int]:
            rows = [row[p] for p in predecessors[key] if p in row]
            return (sum(rows) / len(rows) if rows else float("inf"), order[key])

        for index, key in enumerate(sorted(members, key=barycentre)):
            row[key] = index
    return {key: (column[key], row[key]) for key in keys}


def lineage_svg(nodes: Sequence[Node], edges: Sequence[tuple[str, str]]) -> SafeString:
    """The graph as inline SVG, as wide as it needs (the page scrolls it sideways on a small screen). Nodes with an
    `href` are links."""
    if not nodes:
        return mark_safe("")
    layout = layered_layout(nodes, edges)
    columns = 1 + max(col for col, _ in layout.values())
    rows = 1 + max(r for _, r in layout.values())
    width = PAD * 2 + columns * NODE_WIDTH + (columns - 1) * COLUMN_GAP
    height = PAD * 2 + rows * NODE_HEIGHT + (rows - 1) * ROW_GAP

    def corner(key: str) -> tuple[float, float]:
        col, r = layout[key]
        return PAD + col * (NODE_WIDTH + COLUMN_GAP), PAD + r * (NODE_HEIGHT + ROW_GAP)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="lineage" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="Lineage graph" font-family="system-ui, sans-serif" font-size="12">'
        '<defs><marker id="lineage-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#6b7385"/></marker></defs>'
    ]
    seen = set()
    for source, target in edges:
        if source not in layout or target not in layout or (source, target) in seen:
            continue
        seen.add((source, target))
        if layout[target][0] <= layout[source][0]:
            continue  # a cycle's back edge: not drawn
        x1, y1 = corner(source)
        x2, y2 = corner(target)
        x1, y1, y2 = x1 + NODE_WIDTH, y1 + NODE_HEIGHT / 2, y2 + NODE_HEIGHT / 2
        bend = COLUMN_GAP / 2
        parts.append(
            f'<path class="lineage-edge" data-source="{escape(source)}" data-target="{escape(target)}" '
            f'd="M{x1:g},{y1:g} C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2:g},{y2:g}" fill="none" '
            f'stroke="#6b7385" stroke-width="1.2" marker-end="url(#lineage-arrow)"/>'
        )
    for node in nodes:
        x, y = corner(node.key)
        label = node.label if len(node.label) <= MAX_LABEL else node.label[: MAX_LABEL - 1] + "…"
        stroke = 'stroke="#b42318" stroke-dasharray="4 3"' if node.failed else 'stroke="#9aa3b5"'
        box = (
            f'<g class="lineage-node" data-key="{escape(node.key)}" data-kind="{escape(node.kind)}">'
            f"<title>{escape(KIND_NAMES.get(node.kind, node.kind))}: {escape(node.label)}"
            f"{' · ' + escape(node.detail) if node.detail else ''}</title>"
            f'<rect x="{x:g}" y="{y:g}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" rx="6" '
            f'fill="{FILL.get(node.kind, "#fff")}" {stroke}/>'
            f'<text x="{x + 8:g}" y="{y + 18:g}" font-weight="600">{escape(label)}</text>'
            f'<text x="{x + 8:g}" y="{y + 34:g}" fill="#6b7385" font-size="11">'
            f"{escape(node.detail[:MAX_DETAIL])}</text></g>"
        )
        parts.append(f'<a href="{escape(node.href)}">{box}</a>' if node.href else box)
    parts.append("</svg>")
    return mark_safe("".join(parts))
