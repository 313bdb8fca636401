"""Serializer fields and the model serializer base every API resource uses: JSON checked as the forms check it,
and primary keys confined to the request's project."""

from __future__ import annotations

from django.db import models
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from feedback_app.text_checks import json_problem


class CheckedJSONField(serializers.JSONField):
    """DRF's JSONField, also for values a form or multipart body sends as JSON text: ``null`` for a field that may
    not be null is refused (as it is in a JSON body), and so is anything `json_problem` finds."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value is None and not self.allow_null:
            self.fail("null")
        found = json_problem(value)
        if found is not None:
            path, reason = found
            raise serializers.ValidationError(f"{path}: {reason}" if path else reason)
        return value


class TandemModelSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.JSONField: CheckedJSONField,
    }


RESEARCHERS_ONLY = " Researchers and admins only: annotators do not get this field."


def in_project(serializer: serializers.Field, model, project_path: str = "project", **filters):
    """A queryset of `model` limited to the request's project (all rows when building the schema)."""
    project = serializer.context.get("project")
    return model.objects.filter(**{project_path: project}, **filters) if project is not None else model.objects.all()


@extend_schema_field(OpenApiTypes.INT)
class ProjectRelatedField(serializers.PrimaryKeyRelatedField):
    """A primary key that must name a row of the request's project: another project's id reads as "does not
    exist", so ids do not leak across projects."""

    def __init__(self, model=None, project_path: str = "project", **kwargs) -> None:
        self.model = model
        self.project_path = project_path
        super().__init__(**kwargs)

    def get_queryset(self):
        return in_project(self, self.model, self.project_path)


# --- Projects -----------------------------------------------------------------------------------------------------
