"""The API's query filters, parsed through one validated path.

Every filter set derives from `TandemFilterSet`, and `TandemFilterBackend` (REST_FRAMEWORK's filter backend) builds
the ones views declare with `filterset_fields` on it too. Numeric filters here are ids, seeds, scores and counts:
they parse as whole numbers that fit a 64-bit column, so ``?seed=9223372036854775808`` or ``?annotator=1e400`` is a
400 naming the filter, never a query the database cannot run. Moments are sent to the database in UTC, and one that
has no UTC time (``0001-01-01T00:00+01:00``) is a 400 too.
"""

from __future__ import annotations

import datetime as dt

from django import forms
from django.core.exceptions import ValidationError
from django_filters import rest_framework as filters
from django_filters.fields import IsoDateTimeField

from feedback_app.text_checks import INT64_MAX, INT64_MIN


class UTCDateTimeField(IsoDateTimeField):
    """An ISO 8601 moment, in UTC: PostgreSQL refuses offsets beyond 15:59, which ISO 8601 allows up to 23:59."""

    def to_python(self, value):
        moment = super().to_python(value)
        if moment is None or moment.tzinfo is None:
            return moment
        try:
            return moment.astimezone(dt.UTC)
        except (OverflowError, ValueError):
            raise ValidationError("This moment lies outside the calendar the database can store.") from None


class TandemFilterSet(filters.FilterSet):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for declared in self.filters.values():  # this instance's copies of the declared filters
            if isinstance(declared, filters.NumberFilter):
                declared.field_class = forms.IntegerField
                declared.extra.setdefault("min_value", INT64_MIN)
                declared.extra.setdefault("max_value", INT64_MAX)
            elif isinstance(declared, filters.IsoDateTimeFilter):
                declared.field_class = UTCDateTimeField


class TandemFilterBackend(filters.DjangoFilterBackend):
    filterset_base = TandemFilterSet
