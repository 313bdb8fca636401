"""What the training page's and run page's tests share: their addresses and reading one input of the launch
form."""

from __future__ import annotations

from django.urls import reverse

HTMX = {"HTTP_HX_REQUEST": "true"}


def url(project, name="training", *args):
    return reverse(name, args=[project.pk, *args])


def field_html(body: str, name: str) -> str:
    """The markup of the launch form's input `name` with its help and error (one `launch-field` block)."""
    blocks = [block for block in body.split('<div class="launch-field') if f'name="{name}"' in block]
    assert blocks, f"no input named {name}"
    return blocks[0].split("</div>")[0]
