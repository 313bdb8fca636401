from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import models, transaction

from feedback_app.text_checks import text_problem

REPLACEMENT = "\ufffd"


def repaired_text(value: str) -> str:
    """`value` with each lone surrogate and NUL replaced by U+FFFD, the Unicode replacement character."""
    return "".join(REPLACEMENT if char == "\x00" or "\ud800" <= char <= "\udfff" else char for char in value)


def repaired_json(value: Any) -> Any:
    if isinstance(value, str):
        return repaired_text(value) if text_problem(value) else value
    if isinstance(value, dict):
        return {repaired_json(key): repaired_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [repaired_json(item) for item in value]
    return value


class Command(BaseCommand):
    help = (
        "Find stored text and JSON values that are not valid Unicode (lone surrogates) or hold NUL characters, "
        "which break every page and API response that shows their row. Lists them; with --fix, replaces each bad "
        "character with U+FFFD in place (labels included: this repairs, it does not revise)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--fix", action="store_true", help="Write the repaired values (default: only report).")

    def handle(self, *args, fix: bool, **options) -> None:
        found = 0
        for model in apps.get_app_config("feedback_app").get_models():
            fields = [
                field
                for field in model._meta.concrete_fields
                if isinstance(field, models.CharField | models.TextField | models.JSONField)
            ]
            if not fields:
                continue
            names = [field.name for field in fields]
            for row in model.objects.only("pk", *names).iterator(chunk_size=500):
                changes = {}
                for field in fields:
                    value = getattr(row, field.name)
                    if isinstance(field, models.JSONField):
                        repaired = repaired_json(value)
                        if repaired != value:
                            changes[field.name] = repaired
                    elif isinstance(value, str) and text_problem(value):
                        changes[field.name] = repaired_text(value)
                if not changes:
                    continue
                found += 1
                self.stdout.write(f"{model._meta.label} {row.pk}: {', '.join(sorted(changes))}")
                if fix:
                    with transaction.atomic():
                        model.objects.filter(pk=row.pk).update(**changes)
        verb = "repaired" if fix else "found (run with --fix to repair them)"
        self.stdout.write(f"{found} row(s) with invalid text {verb}.")
