from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from feedback_app.models import DatasetSnapshot
from tests.feedback_app.exports.helpers import rows


def test_it_writes_the_same_rows_as_the_api(labelled_project, tmp_path):
    out = tmp_path / "stepwise.jsonl"
    call_command("export_dataset", labelled_project.slug, "stepwise", "--out", str(out), "--neutral", "positive")
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert exported == rows(labelled_project, "stepwise", neutral="positive")
    assert not list(tmp_path.glob("*.part"))


def test_it_can_freeze_a_snapshot(labelled_project, settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path
    call_command("export_dataset", str(labelled_project.pk), "preference", "--snapshot", "v1", "--exclude-gold")
    snapshot = DatasetSnapshot.objects.get(name="v1")
    assert snapshot.filters == {"exclude_gold": True}
    assert snapshot.row_count == len(rows(labelled_project, "preference"))


def test_bad_filters_fail_naming_the_field(labelled_project, tmp_path):
    with pytest.raises(CommandError, match="min_agreement"):
        call_command(
            "export_dataset", labelled_project.slug, "sft", "--out", str(tmp_path / "x"), "--min-agreement", "1"
        )
    with pytest.raises(CommandError, match="project"):
        call_command("export_dataset", "nope", "sft", "--out", str(tmp_path / "x"))
    assert not list(tmp_path.iterdir())


def test_it_takes_the_ties_and_interventions_options_and_the_returns_kind(labelled_project, tmp_path):
    out = tmp_path / "prefs.jsonl"
    call_command("export_dataset", labelled_project.slug, "preference", "--out", str(out), "--ties", "include")
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert exported == rows(labelled_project, "preference", ties="include")
    call_command("export_dataset", labelled_project.slug, "stepwise", "--out", str(out), "--interventions", "exclude")
    assert {json.loads(line)["source"] for line in out.read_text().splitlines()} == {"label"}
    call_command("export_dataset", labelled_project.slug, "returns", "--out", str(out))
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows(labelled_project, "returns")
    with pytest.raises(CommandError, match="ties"):
        call_command("export_dataset", labelled_project.slug, "sft", "--out", str(out), "--ties", "include")
