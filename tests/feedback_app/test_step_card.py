"""The step card every workspace shows (the `step_card` tag): what it shows, and that every field is escaped."""

from __future__ import annotations

import re
from html import unescape

from django.template import Context, Template
from django.utils.safestring import SafeString

from feedback_app.models import Step
from feedback_app.templatetags.tandem import step_card


def field_text(html: str, field: str) -> str:
    """The text inside the element marked data-span-field=`field`, as a browser would read it."""
    match = re.search(rf'data-span-field="{field}">(.*?)</', html, re.S)
    assert match is not None, f"no {field} field in {html}"
    return unescape(match.group(1))


def test_a_text_step_shows_its_fields_escaped_and_exactly_as_stored():
    step = Step(pk=7, index=2, observation="\n<b>bold</b> & more", reasoning="a < b", action="click('x')")
    html = step_card(step)
    assert isinstance(html, SafeString)
    assert html.startswith('<article class="step card" id="step-7">') and html.endswith("</article>")
    assert "<strong>Step 3</strong>" in html
    assert "<b>" not in html and "&lt;b&gt;bold&lt;/b&gt; &amp; more" in html
    # Span offsets of critiques count characters of the stored text, leading newline included.
    assert field_text(html, "observation") == step.observation
    assert field_text(html, "reasoning") == "a < b"
    assert field_text(html, "action") == "click('x')"


def test_a_grid_step_shows_its_map_instead_of_the_observation_text():
    rows = [["A", "<"], ["#", "."]]
    step = Step(pk=1, index=0, observation="A G", action="right", render={"kind": "grid", "rows": rows})
    html = step_card(step)
    assert '<table class="gridmap" aria-label="map at step 1">' in html
    assert '<td class="cell cell-wall"><span class="sr-only">wall</span></td><td class="cell cell-floor"></td>' in html
    assert '<td class="cell cell-other">&lt;</td>' in html
    assert 'data-span-field="observation"' not in html


def test_the_reward_shows_only_with_outcomes_and_when_it_is_not_zero():
    rewarded = Step(pk=1, index=0, action="a", env_reward=0.75)
    assert "reward 0.75" in step_card(rewarded, True)
    assert "reward" not in step_card(rewarded, False)
    assert "reward" not in step_card(Step(pk=2, index=0, action="a", env_reward=0.0), True)


def test_images_and_tool_calls_are_shown_escaped_and_other_media_left_out():
    step = Step(
        pk=3,
        index=1,
        action="",
        media=[
            {"type": "image", "url": "https://example.org/a.png?x=1&y=2", "caption": 'a "quoted" caption'},
            {"type": "image", "url": "b.png"},
            {"type": "audio", "url": "c.mp3"},
        ],
        tool_calls=[{"name": "search", "arguments": {"q": "<script>"}}],
    )
    html = step_card(step)
    assert '<img src="https://example.org/a.png?x=1&amp;y=2" alt="a &quot;quoted&quot; caption" class="media">' in html
    assert '<img src="b.png" alt="step media" class="media">' in html
    assert "c.mp3" not in html
    assert "<code>search({&#x27;q&#x27;: &#x27;&lt;script&gt;&#x27;})</code>" in html


def test_malformed_render_media_and_tool_calls_are_ignored_not_an_error():
    step = Step(pk=4, index=0, observation="text", action="a", render=["grid"], media="x", tool_calls={"name": "y"})
    html = step_card(step)
    assert field_text(html, "observation") == "text" and "<img" not in html and "tool-call" not in html


def test_templates_use_it_as_a_tag():
    step = Step(pk=5, index=0, observation="o", action="a", env_reward=1.0)
    html = Template("{% load tandem %}{% step_card step show_outcomes %}").render(
        Context({"step": step, "show_outcomes": True})
    )
    assert html == step_card(step, True)
