"""The API's query filters, parsed through one validated path.

Every filter set derives from `TandemFilterSet`, and `TandemFilterBackend` (REST_FRAMEWORK's filter backend) builds
the ones views declare with `filterset_fields` on it too. Numeric filters here are ids, seeds, scores and counts:
they parse as whole numbers that fit a 64-bit column, so ``?seed=9223372036854775808`` or ``?annotator=1e400`` is a
400 naming the filter, never a query the database cannot run.
"""

from __future__ import annotations

from django import forms
from django_filters import rest_framework as filters

from feedback_app.text_checks import INT64_MAX, INT64_MIN


class TandemFilterSet(filters.FilterSet):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for declared in self.filters.values():  # this instance's copies of the declared filters
            if isinstance(declared, filters.NumberFilter):
                declared.field_class = forms.IntegerField
                declared.extra.setdefault("min_value", INT64_MIN)
                declared.extra.setdefault("max_value", INT64_MAX)


class TandemFilterBackend(filters.DjangoFilterBackend):
    filterset_base = TandemFilterSet
