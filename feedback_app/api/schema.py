"""The OpenAPI schema: every operation lists the errors it can answer with, not only its success.

`TandemAutoSchema` (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS) adds the errors every API view shares: 401 without valid
credentials, 403 for a missing role or a read-only token, 404 for anything outside the caller's projects, 400 on
writes and 429 when throttled. Errors a view declares itself with @extend_schema are kept as they are.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers
from rest_framework.permissions import AllowAny


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What went wrong, in words.")


class ValidationErrorSerializer(serializers.Serializer):
    """DRF's validation errors: each bad field's name maps to its reasons (or to nested errors);
    `non_field_errors` holds the rest."""

    non_field_errors = serializers.ListField(child=serializers.CharField(), required=False)


class RowErrorSerializer(serializers.Serializer):
    row = serializers.IntegerField(help_text="1-based row number; for JSON Lines, the line number.")
    field = serializers.CharField(help_text="Dotted path of the bad field, e.g. steps[0].action.")
    reason = serializers.CharField()


class ImportRejectedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    bad_rows = serializers.IntegerField(help_text="How many rows were bad (all of them, not only those listed).")
    errors = RowErrorSerializer(many=True, help_text="The first 100 problems.")


SHARED_ERRORS = {
    "401": "No credentials, or an invalid or revoked API token.",
    "403": "The caller's project role does not allow this, or the API token is read-only.",
    "404": "No such object in the caller's projects (outsiders always get 404, never a hint).",
    "429": "Too many requests; retry after the number of seconds in Retry-After.",
}
WRITE_METHODS = ("POST", "PUT", "PATCH")


class TandemAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        public = any(isinstance(permission, AllowAny) for permission in self.view.get_permissions())
        errors = {} if public else dict(SHARED_ERRORS)
        if public:
            errors["429"] = SHARED_ERRORS["429"]
        if self.method in WRITE_METHODS:
            invalid = self._error_response(ValidationErrorSerializer, "The request body is invalid.")
            responses.setdefault("400", invalid)
        for code, description in errors.items():
            responses.setdefault(code, self._error_response(ErrorSerializer, description))
        return operation

    def _map_basic_serializer(self, serializer, direction):
        # Fields HiddenFieldsMixin drops for annotators (outcomes; policies in blind projects) are not in every
        # response, so the schema must not call them required.
        schema = super()._map_basic_serializer(serializer, direction)
        meta = getattr(serializer, "Meta", None)
        hidden = {*getattr(meta, "outcome_fields", ()), *getattr(meta, "policy_fields", ())}
        if hidden and "required" in schema:
            schema["required"] = [name for name in schema["required"] if name not in hidden]
            if not schema["required"]:
                del schema["required"]
        return schema

    def get_tags(self) -> list[str]:
        # Group by resource (/api/projects/{project_pk}/comparisons/ -> "comparisons"), not all under "projects".
        parts = [part for part in self.path.split("/") if part and part != "api"]
        if len(parts) > 2 and parts[0] == "projects" and parts[1] == "{project_pk}":
            return [parts[2]]
        return [parts[0]] if parts else super().get_tags()

    def _error_response(self, serializer_class, description: str) -> dict:
        component = self.resolve_serializer(serializer_class(), "response")
        return {"description": description, "content": {"application/json": {"schema": component.ref}}}
