from __future__ import annotations

import markdown as markdown_lib
import nh3
from django import template
from django.utils.formats import localize
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Grid renders use one character per cell; these are the gridworld's, and any environment may reuse them.
CELL_CLASSES = {"#": "wall", ".": "floor", "A": "agent", "G": "goal"}


@register.filter
def cell_class(cell: str) -> str:
    return CELL_CLASSES.get(cell, "other")


# Floor cells carry no text, and a wall's colour is told in words to screen readers only; the agent, the goal and
# anything else show their character.
_CELL_TEXT = {".": "", "#": '<span class="sr-only">wall</span>'}


@register.simple_tag
def gridmap(rows: list[list[str]], step_number: int) -> SafeString:
    """A grid render as an HTML table. Built in Python because a map has dozens of cells and a compare page shows
    two maps per step: as nested template loops it was most of the page's rendering time."""
    cells = {}

    def cell_html(cell: str) -> str:
        if cell not in cells:
            text = _CELL_TEXT.get(cell, escape(cell))
            cells[cell] = f'<td class="cell cell-{cell_class(cell)}">{text}</td>'
        return cells[cell]

    body = "".join("<tr>" + "".join(cell_html(str(cell)) for cell in row) + "</tr>" for row in rows)
    return mark_safe(f'<table class="gridmap" aria-label="map at step {int(step_number)}">{body}</table>')


@register.simple_tag
def step_card(step, show_outcomes: bool = False) -> SafeString:
    """One step as the workspaces show it: header, the environment's render (a grid map, or the observation's text),
    images, reasoning, action and tool calls. Built in Python for the same reason as `gridmap`: every compare page
    shows a dozen or more steps, and as a template this was most of a trajectory's first render.

    The observation, reasoning and action sit in ``data-span-field`` elements whose text is exactly the field's, so a
    critique's span offsets count characters of the stored text."""
    number = step.index + 1
    reward = (
        f' <span class="muted">reward {localize(step.env_reward)}</span>' if show_outcomes and step.env_reward else ""
    )
    parts = [
        f'<article class="step card" id="step-{int(step.pk)}">',
        f"<header><strong>Step {number}</strong>{reward}</header>",
    ]
    render = step.render if isinstance(step.render, dict) else {}
    if render.get("kind") == "grid":
        parts.append(gridmap(render.get("rows") or [], number))
    elif step.observation:
        # The span wrapper keeps a leading newline (the parser drops one right after <pre>), so offsets match.
        parts.append(
            f'<pre class="observation"><span data-span-field="observation">{escape(step.observation)}</span></pre>'
        )
    for item in step.media if isinstance(step.media, list) else []:
        if isinstance(item, dict) and item.get("type") == "image":
            alt = escape(item.get("caption") or "step media")
            parts.append(f'<img src="{escape(item.get("url", ""))}" alt="{alt}" class="media">')
    if step.reasoning:
        parts.append(
            '<p class="reasoning"><span class="muted">reasoning</span> <span class="field-text" '
            f'data-span-field="reasoning">{escape(step.reasoning)}</span></p>'
        )
    parts.append(
        '<p class="action"><span class="muted">action</span> <code class="field-text" '
        f'data-span-field="action">{escape(step.action)}</code></p>'
    )
    for call in step.tool_calls if isinstance(step.tool_calls, list) else []:
        if isinstance(call, dict):
            text = f"{call.get('name', '')}({call.get('arguments', '')})"
            parts.append(f'<p class="tool-call"><span class="muted">tool</span> <code>{escape(text)}</code></p>')
    return mark_safe(parts[0] + "\n  " + "\n  ".join(parts[1:]) + "\n</article>")


# Guidelines are written by researchers but read by everyone, so the HTML that markdown makes is cleaned: no
# scripts, no event handlers, no javascript: or data: links, only a few URL schemes.
GUIDELINE_URL_SCHEMES = {"http", "https", "mailto"}


@register.filter
def markdown(text: str | None) -> SafeString:
    html = markdown_lib.markdown(text or "", extensions=["extra", "sane_lists"], output_format="html")
    return mark_safe(nh3.clean(html, url_schemes=GUIDELINE_URL_SCHEMES, link_rel="noopener noreferrer nofollow"))


# A run of this many characters without a space gets a line-break opportunity after each such run.
WRAP_EVERY = 24


@register.filter
def wrappable(text) -> SafeString:
    """`text`, escaped, with a `<wbr>` inside every run of more than WRAP_EVERY characters without a space: a long
    name in a table cell wraps instead of widening the table to its full length, and shorter words (numbers, dates)
    never break."""
    words = str(text if text is not None else "").split(" ")
    pieces = [
        "<wbr>".join(escape(word[i : i + WRAP_EVERY]) for i in range(0, len(word), WRAP_EVERY)) or "" for word in words
    ]
    return mark_safe(" ".join(pieces))
