"""The step card every workspace shows (the `step_card` tag): what it shows, and that every field is escaped."""

from __future__ import annotations

import json
import re
from html import unescape

from django.template import Context, Template
from django.utils.safestring import SafeString

from feedback_app.models import Step
from feedback_app.templatetags.tandem import mark_repeated_observations, step_card


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
    assert "<code>search</code>" in html
    assert '<dl class="tool-arguments"><dt>q</dt><dd>&lt;script&gt;</dd></dl>' in html


def test_a_chat_turn_shows_each_tool_call_readably_with_its_raw_json_and_the_result_beside_it():
    calls = [
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "add_to_cart", "arguments": '{"sku": "A-7", "qty": 2}'},
        },
        {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"name": "<tea>"}'}},
        {"id": "call_c", "type": "function", "function": {"name": "checkout", "arguments": "not json"}},
    ]
    step = Step(
        pk=9,
        index=0,
        reasoning="I will look it up.",
        action="",
        message={"role": "assistant", "content": "I will look it up.", "tool_calls": calls},
        replies=[
            # Answered out of order, as parallel calls may be: each result is matched by its call's id.
            {"role": "tool", "tool_call_id": "call_a", "name": "lookup", "content": '{"sku": "A-7"}'},
            {"role": "tool", "tool_call_id": "call_b", "name": "add_to_cart", "content": "added 2 × A-7"},
            {"role": "user", "content": "the next observation"},
        ],
    )
    html = step_card(step)
    exchanges = re.findall(r'<div class="tool-exchange" data-tool-call="(\d)">(.*?)</div></div>', html, re.S)
    assert [position for position, _ in exchanges] == ["0", "1", "2"]
    add, lookup, checkout = (body for _, body in exchanges)
    assert "<code>add_to_cart</code>" in add and "<dt>sku</dt><dd>A-7</dd><dt>qty</dt><dd>2</dd>" in add
    assert "added 2 × A-7" in add
    assert "<dt>name</dt><dd>&lt;tea&gt;</dd>" in lookup and "{&quot;sku&quot;: &quot;A-7&quot;}" in lookup
    assert "not a JSON object: <code>not json</code>" in checkout and "no result" in checkout
    # The raw call is one click away, verbatim.
    raw = re.search(r"<summary>raw JSON</summary><pre>(.*?)</pre>", add, re.S).group(1)
    assert json.loads(unescape(raw)) == calls[0]
    assert "the next observation" not in html  # the next step shows it


def test_calls_written_in_the_text_as_a_qwen_style_model_writes_them_are_shown_as_calls():
    content = 'Checking.\n<tool_call>\n{"name": "lookup", "arguments": {"name": "tea"}}\n</tool_call>'
    step = Step(pk=10, index=0, action="", message={"role": "assistant", "content": content})
    html = step_card(step)
    assert "<code>lookup</code>" in html and "<dt>name</dt><dd>tea</dd>" in html


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


def test_an_observation_that_only_repeats_the_tool_results_before_it_is_shown_once_with_its_call():
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "mug"}'}}
    result = {"role": "tool", "tool_call_id": "c1", "name": "search", "content": '[{"id": "kq48"}]'}
    user = {"role": "user", "content": "and a lamp"}

    def turn(pk, index, observation, replies):
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        return Step(pk=pk, index=index, observation=observation, action="", message=message, replies=replies)

    # As an environment joins its results, as an import writes them, and a user's turn that says more.
    steps = mark_repeated_observations(
        [
            turn(1, 0, "Buy a mug.", [result]),
            turn(2, 1, '[{"id": "kq48"}]', [result]),
            turn(3, 2, '[search] [{"id": "kq48"}]', [result, user]),
            turn(4, 3, '[search] [{"id": "kq48"}]\nand a lamp', []),
        ]
    )
    assert [step.observation_repeats for step in steps] == [False, True, True, False]
    cards = [step_card(step) for step in steps]
    assert field_text(cards[0], "observation") == "Buy a mug."
    assert 'data-span-field="observation"' not in cards[1] and 'data-span-field="observation"' not in cards[2]
    assert field_text(cards[3], "observation").endswith("and a lamp")
    assert cards[1].count("[{&quot;id&quot;: &quot;kq48&quot;}]") == 1  # once, as the result of its call
