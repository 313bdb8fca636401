"""`manage.py repair_text` finds stored values that are not valid Unicode and, with --fix, repairs them in place."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from feedback_app.models import Task

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL refuses such values when they are written")
def test_it_reports_then_repairs_a_lone_surrogate_and_a_nul(project):
    bad = Task.objects.create(project=project, instruction="go\x00on", spec={"goal\ud800": ["ok", "\udc00x"]})
    good = Task.objects.create(project=project, instruction="fine", spec={"a": 1})

    report = io.StringIO()
    call_command("repair_text", stdout=report)
    assert f"feedback_app.Task {bad.pk}: instruction, spec" in report.getvalue()
    assert "1 row(s)" in report.getvalue()
    bad.refresh_from_db()
    assert bad.instruction == "go\x00on"  # a report writes nothing

    call_command("repair_text", "--fix", stdout=io.StringIO())
    bad.refresh_from_db()
    assert bad.instruction == "go\ufffdon"
    assert bad.spec == {"goal\ufffd": ["ok", "\ufffdx"]}
    good.refresh_from_db()
    assert (good.instruction, good.spec) == ("fine", {"a": 1})
    again = io.StringIO()
    call_command("repair_text", stdout=again)
    assert "0 row(s)" in again.getvalue()
