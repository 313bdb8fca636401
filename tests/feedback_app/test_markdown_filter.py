"""Guidelines are markdown, rendered to HTML that cannot run anything."""

from __future__ import annotations

from django.template import Context, Template
from django.utils.safestring import SafeString

from feedback_app.templatetags.tandem import markdown


def test_it_renders_markdown():
    html = markdown("# Be kind\n\nLabel **carefully**:\n\n- one\n- two\n\n[docs](https://example.org/docs)")
    assert "<h1>Be kind</h1>" in html
    assert "<strong>carefully</strong>" in html
    assert "<li>one</li>" in html
    assert '<a href="https://example.org/docs" rel="noopener noreferrer nofollow">docs</a>' in html


def test_it_strips_script_tags_and_their_content():
    html = markdown("Hello <script>alert('x')</script> world\n\n<script src=https://evil.example/x.js></script>")
    assert "<script" not in html and "alert" not in html and "evil.example" not in html
    assert "Hello" in html and "world" in html


def test_it_strips_javascript_and_data_links():
    html = markdown(
        '[click](javascript:alert(1)) and <a href="JaVaScRiPt:alert(2)">this</a> and [d](data:text/html,x)'
    )
    assert "javascript" not in html.lower() and "data:" not in html
    assert "click" in html and "this" in html


def test_it_strips_event_handlers_and_styles():
    html = markdown(
        '<img src="https://example.org/x.png" onerror="alert(1)"> <p style="color:red" onclick="x()">x</p>'
    )
    assert "onerror" not in html and "onclick" not in html and "style=" not in html and "alert" not in html
    assert '<img src="https://example.org/x.png">' in html


def test_empty_guidelines_render_as_nothing():
    assert markdown("") == "" and markdown(None) == ""


def test_the_filter_output_is_not_escaped_again_in_templates():
    rendered = Template("{% load tandem %}{{ text|markdown }}").render(Context({"text": "*hi* <b>x</b> & y"}))
    assert isinstance(markdown("x"), SafeString)
    assert "<em>hi</em>" in rendered and "<b>x</b>" in rendered and "&amp; y" in rendered
