from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import markdown as markdown_lib
import nh3
from django import template
from django.utils.formats import localize
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from reward_models.conversation import message_tool_calls, reply_text

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
    images, reasoning, and the action or, for a turn that calls tools, each call beside its result. Built in Python
    for the same reason as `gridmap`: every compare page shows a dozen or more steps, and as a template this was most
    of a trajectory's first render.

    The observation, reasoning and action sit in ``data-span-field`` elements whose text is exactly the field's, so a
    critique's span offsets count characters of the stored text."""
    number = step.index + 1
    dom_id = getattr(step, "dom_id", None) or f"step-{int(step.pk)}"  # a turn not yet stored names its own
    reward = (
        f' <span class="muted">reward {localize(step.env_reward)}</span>' if show_outcomes and step.env_reward else ""
    )
    parts = [
        f'<article class="step card" id="{escape(dom_id)}">',
        f"<header><strong>Step {number}</strong>{reward}</header>",
    ]
    render = step.render if isinstance(step.render, dict) else {}
    if render.get("kind") == "grid":
        parts.append(gridmap(render.get("rows") or [], number))
    elif step.observation and not getattr(step, "observation_repeats", False):
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
    calls = _tool_calls_html(step)
    if not calls:  # a turn that calls tools shows each call below; the action line would repeat them
        parts.append(
            '<p class="action"><span class="muted">action</span> <code class="field-text" '
            f'data-span-field="action">{escape(step.action)}</code></p>'
        )
    parts.extend(calls)
    return mark_safe(parts[0] + "\n  " + "\n  ".join(parts[1:]) + "\n</article>")


def mark_repeated_observations(steps: Iterable[Any]) -> list[Any]:
    """The steps as a list, each marked ``observation_repeats`` when its observation is only the tool results that
    answered the step before it: that step's card shows them beside its calls, so `step_card` leaves them out here
    instead of showing every result twice. An observation that says anything else (a user's turn) is kept."""
    steps = list(steps)
    previous: set[str] = set()
    for step in steps:
        step.observation_repeats = bool(step.observation) and step.observation in previous
        replies = step.replies if isinstance(step.replies, list) else []
        previous = set()
        if replies and all(isinstance(r, dict) and r.get("role") == "tool" for r in replies):
            # As an import writes it (each result after its tool's name), or as an environment joins its results.
            previous.add(reply_text(replies))
            if all(isinstance(r.get("content"), str) for r in replies):
                previous.add("\n".join(r["content"] for r in replies))
    return steps


def _tool_calls_html(step) -> list[str]:
    """Each tool call of the step's assistant message (verbatim; `tool_calls` for a step stored without one) as its
    name and readable arguments, the raw JSON one click away, and beside it the tool message that answered it (by
    `tool_call_id`, else in order)."""
    message = step.message if isinstance(step.message, dict) else {}
    calls = message_tool_calls(message) if message else []
    if not calls and isinstance(step.tool_calls, list):
        calls = [call for call in step.tool_calls if isinstance(call, dict)]
    replies = [r for r in (step.replies if isinstance(step.replies, list) else []) if isinstance(r, dict)]
    results = [reply for reply in replies if reply.get("role") == "tool"]
    call_ids = {call.get("id") for call in calls if isinstance(call.get("id"), str)}
    by_id = {reply["tool_call_id"]: reply for reply in results if reply.get("tool_call_id") in call_ids}
    unmatched = [reply for reply in results if reply.get("tool_call_id") not in by_id]
    html = []
    for position, call in enumerate(calls):
        function = call.get("function", call)
        function = function if isinstance(function, dict) else {}
        name, arguments = str(function.get("name", "")), function.get("arguments", "")
        parsed = _parsed_arguments(arguments)
        if isinstance(parsed, dict) and parsed:
            readable = "".join(
                f"<dt>{escape(key)}</dt><dd>{escape(_argument_text(value))}</dd>" for key, value in parsed.items()
            )
            readable = f'<dl class="tool-arguments">{readable}</dl>'
        elif parsed == {}:
            readable = '<p class="muted tool-arguments">no arguments</p>'
        else:
            readable = (
                '<p class="field-error tool-arguments">arguments that are not a JSON object: '
                f"<code>{escape(str(arguments))}</code></p>"
            )
        raw = json.dumps(call, ensure_ascii=False, indent=2)
        reply = by_id.get(call.get("id")) if isinstance(call.get("id"), str) else None
        if reply is None and unmatched:
            reply = unmatched.pop(0)
        if reply is not None:
            content = reply.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            result = f'<div class="tool-result"><span class="role">result</span><pre>{escape(text)}</pre></div>'
        else:
            result = '<div class="tool-result muted">no result</div>'
        html.append(
            f'<div class="tool-exchange" data-tool-call="{position}"><div class="tool-call">'
            f'<span class="role">tool call</span> <code>{escape(name)}</code>{readable}'
            f"<details><summary>raw JSON</summary><pre>{escape(raw)}</pre></details></div>{result}</div>"
        )
    return html


def _parsed_arguments(arguments: Any) -> Any:
    """A call's arguments as a value: OpenAI sends them as a JSON string, other formats as an object. None when
    the string is not JSON."""
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return None


def _argument_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


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
