from __future__ import annotations

import markdown as markdown_lib
import nh3
from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Grid renders use one character per cell; these are the gridworld's, and any environment may reuse them.
CELL_CLASSES = {"#": "wall", ".": "floor", "A": "agent", "G": "goal"}


@register.filter
def cell_class(cell: str) -> str:
    return CELL_CLASSES.get(cell, "other")


# Floor and wall cells carry no text; the agent, the goal and anything else show their character.
_QUIET_CELLS = {".", "#"}


@register.simple_tag
def gridmap(rows: list[list[str]], step_number: int) -> SafeString:
    """A grid render as an HTML table. Built in Python because a map has dozens of cells and a compare page shows
    two maps per step: as nested template loops it was most of the page's rendering time."""
    cells = {}

    def cell_html(cell: str) -> str:
        if cell not in cells:
            text = "" if cell in _QUIET_CELLS else escape(cell)
            cells[cell] = f'<td class="cell cell-{cell_class(cell)}">{text}</td>'
        return cells[cell]

    body = "".join("<tr>" + "".join(cell_html(str(cell)) for cell in row) + "</tr>" for row in rows)
    return mark_safe(f'<table class="gridmap" aria-label="map at step {int(step_number)}">{body}</table>')


# Guidelines are written by researchers but read by everyone, so the HTML that markdown makes is cleaned: no
# scripts, no event handlers, no javascript: or data: links, only a few URL schemes.
GUIDELINE_URL_SCHEMES = {"http", "https", "mailto"}


@register.filter
def markdown(text: str | None) -> SafeString:
    html = markdown_lib.markdown(text or "", extensions=["extra", "sane_lists"], output_format="html")
    return mark_safe(nh3.clean(html, url_schemes=GUIDELINE_URL_SCHEMES, link_rel="noopener noreferrer nofollow"))
