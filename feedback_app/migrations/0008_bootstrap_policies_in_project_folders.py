"""Bootstrapped policies move into their project's artifact folder.

A project may load models only from its own folders (feedback_app/models/locations.py); bootstrap runs used to write
to ARTIFACT_ROOT/policies/bootstrap-run-<id>, outside any project's folder. Each such directory moves to
ARTIFACT_ROOT/policies/<project id>/bootstrap-run-<id>, and the rows that name it follow.
"""

import re
import shutil
from pathlib import Path

from django.conf import settings
from django.db import migrations

_LEGACY = re.compile(r"bootstrap-run-\d+")


def move_bootstrap_policies(apps, schema_editor):
    PolicyVersion = apps.get_model("feedback_app", "PolicyVersion")
    TrainingRun = apps.get_model("feedback_app", "TrainingRun")
    RegisteredModel = apps.get_model("feedback_app", "RegisteredModel")
    policies = Path(settings.ARTIFACT_ROOT) / "policies"
    for version in PolicyVersion.objects.filter(kind="local", weights_path__contains="bootstrap-run-"):
        old = Path(version.weights_path)
        if old.parent != policies or not _LEGACY.fullmatch(old.name):
            continue
        new = policies / str(version.project_id) / old.name
        if old.is_dir() and not new.exists():
            new.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(old), str(new))
        PolicyVersion.objects.filter(pk=version.pk).update(weights_path=str(new))
        TrainingRun.objects.filter(artifact_dir=str(old)).update(artifact_dir=str(new))
        RegisteredModel.objects.filter(base_model=str(old)).update(base_model=str(new))


class Migration(migrations.Migration):
    dependencies = [
        ("feedback_app", "0007_queueitem_open_in_order_by_gold"),
    ]

    operations = [migrations.RunPython(move_bootstrap_policies, migrations.RunPython.noop)]
