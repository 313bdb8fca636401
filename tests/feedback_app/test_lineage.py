"""The lineage graph's layered layout and its SVG (feedback_app/lineage.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from feedback_app.lineage import Node, layered_layout, lineage_svg

SVG = "{http://www.w3.org/2000/svg}"


def chain(*keys: str) -> list[tuple[str, str]]:
    return list(zip(keys, keys[1:], strict=False))


def test_every_edge_points_to_a_later_column():
    nodes = [Node(k, "run", k) for k in ("s", "r1", "p1", "r2", "p2", "m")]
    edges = [*chain("s", "r1", "p1", "r2", "p2"), ("s", "m"), ("m", "r2")]
    layout = layered_layout(nodes, edges)
    for source, target in edges:
        assert layout[target][0] > layout[source][0]
    assert layout["s"][0] == 0 and layout["p2"][0] == 4
    assert layout["r2"][0] == 3  # the longest path decides: s -> r1 -> p1 -> r2


def test_a_chain_of_versions_stays_on_one_row_and_siblings_stack():
    nodes = [Node(k, "policy", k) for k in ("base", "v1", "v2", "w1")]
    layout = layered_layout(nodes, [("base", "v1"), ("v1", "v2"), ("base", "w1")])
    assert layout["base"] == (0, 0) and layout["v1"] == (1, 0) and layout["v2"] == (2, 0)
    assert layout["w1"] == (1, 1)


def test_a_cycle_or_an_unknown_node_does_not_break_the_layout():
    nodes = [Node(k, "policy", k) for k in ("a", "b", "c")]
    layout = layered_layout(nodes, [("a", "b"), ("b", "c"), ("c", "a"), ("a", "ghost")])
    assert set(layout) == {"a", "b", "c"}
    svg = ET.fromstring(lineage_svg(nodes, [("a", "b"), ("b", "c"), ("c", "a")]))
    drawn = {(p.get("data-source"), p.get("data-target")) for p in svg.iter(f"{SVG}path") if p.get("data-source")}
    assert len(drawn) == 2  # the back edge that closes the cycle is not drawn


def test_nodes_are_boxes_in_their_columns_and_links_where_they_have_a_page():
    nodes = [
        Node("s", "snapshot", "prefs"),
        Node("r", "run", "DPO #3", "Succeeded", "/runs/3/"),
        Node("p", "policy", "v2"),
    ]
    svg = ET.fromstring(lineage_svg(nodes, [("s", "r"), ("r", "p")]))
    boxes = {g.get("data-key"): g.find(f"{SVG}rect") for g in svg.iter(f"{SVG}g") if g.get("data-key")}
    xs = [float(boxes[k].get("x")) for k in ("s", "r", "p")]
    assert xs == sorted(xs) and len(set(xs)) == 3
    assert [a.get("href") for a in svg.iter(f"{SVG}a")] == ["/runs/3/"]
    assert int(svg.get("width")) >= 3 * float(boxes["s"].get("width"))


def test_names_are_escaped_and_long_ones_shortened():
    name = '<img src=x onerror="alert(1)"> and a rather long policy name'
    svg = lineage_svg([Node("p", "policy", name)], [])
    assert "<img" not in svg
    root = ET.fromstring(svg)
    (label, _) = root.iter(f"{SVG}text")
    assert label.text.endswith("…") and len(label.text) <= 22
    assert root.find(f".//{SVG}title").text.startswith("policy version: <img")


def test_no_nodes_draw_nothing():
    assert lineage_svg([], []) == ""
