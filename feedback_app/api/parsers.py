"""The API's request parsers: DRF's own, with every parsed value checked by `feedback_app.text_checks` first.

A body that nests too deeply, holds a lone surrogate or NUL, a non-finite number or an integer past 64 bits is a
400 naming the field, before any view or serializer sees it. A multipart or form field that a JSON field reads is
checked the same way once the serializer parses it (`feedback_app.api.fields`).
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

from feedback_app.text_checks import json_problem


def check_parsed(data) -> None:
    """Raise a 400 naming the first unstorable value of a parsed body."""
    found = json_problem(data)
    if found is not None:
        path, reason = found
        raise ValidationError({path or "body": [reason]})


class CheckedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        if not isinstance(data, dict):
            # Every API body is an object; a list or a bare value would reach views that read fields off it.
            raise ParseError(f"The body must be a JSON object, not {type(data).__name__}.")
        check_parsed(data)
        return data


class CheckedFormParser(FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        check_parsed({key: data.getlist(key) for key in data})
        return data


class CheckedMultiPartParser(MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parsed = super().parse(stream, media_type, parser_context)
        check_parsed({key: parsed.data.getlist(key) for key in parsed.data})
        return parsed
