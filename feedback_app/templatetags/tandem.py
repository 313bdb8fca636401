from __future__ import annotations

from django import template

register = template.Library()

# Grid renders use one character per cell; these are the gridworld's, and any environment may reuse them.
CELL_CLASSES = {"#": "wall", ".": "floor", "A": "agent", "G": "goal"}


@register.filter
def cell_class(cell: str) -> str:
    return CELL_CLASSES.get(cell, "other")
