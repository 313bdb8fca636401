"""Serializer fields and the model serializer base every API resource uses."""

from __future__ import annotations

from django.db import models
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
