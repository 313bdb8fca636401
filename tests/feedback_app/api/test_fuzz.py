"""Property-based fuzzing of the whole REST API against its own OpenAPI schema (schemathesis), as a researcher and
as an annotator: no input may make a server error, and every response must match the schema.

Every operation is driven with data that fits the schema and with data that does not, once against rows that exist
(the project's own ids) and once against generated ids. The suite runs a bounded number of cases per operation
(`TANDEM_FUZZ_EXAMPLES`, default 2); `bench/fuzz_api.py` runs the long version and writes its counts as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from feedback_app.models import QueueItem

schemathesis = pytest.importorskip("schemathesis")

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "2"))
ROLES = ("researcher", "annotator")


@pytest.fixture
def world(project, annotator, researcher, make_trajectory, task, settings, tmp_path):
    """A project with a row of every kind the API serves, and a token for each role; its files in a folder of its
    own, so no other test's clean-up can reach them."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    from feedback_app.exports.filters import ExportFilters
    from feedback_app.exports.snapshots import create_snapshot
    from feedback_app.models import ApiToken, Comparison, Critique, Evaluation, Rating, StepLabel, TrainingRun

    first, second = make_trajectory(3), make_trajectory(2)
    QueueItem.objects.enqueue_comparisons(project, [(first, second)])
    QueueItem.objects.enqueue_trajectories(project, [first])
    comparison = Comparison.objects.create(
        project=project, annotator=annotator, trajectory_a=first, trajectory_b=second, choice="a"
    )
    step_label = StepLabel.objects.create(project=project, annotator=annotator, step=first.steps.first(), value=1)
    critique = Critique.objects.create(project=project, annotator=annotator, trajectory=first, text="too slow")
    rating = Rating.objects.create(project=project, annotator=annotator, trajectory=first, score=3)
    run = TrainingRun.objects.create(project=project, kind="rollout", config={})
    evaluation = Evaluation.objects.create(project=project, run=run, name="heldout_success", value=0.5)
    snapshot = create_snapshot(project, "preference", ExportFilters.from_query({}), user=researcher, name="snap")
    ids = {
        "trajectories": first.pk,
        "comparisons": comparison.pk,
        "step-labels": step_label.pk,
        "critiques": critique.pk,
        "ratings": rating.pk,
        "runs": run.pk,
        "evaluations": evaluation.pk,
        "tasks": task.pk,
        "policy-versions": first.policy_version_id,
        "assignments": None,
        "models": None,
    }
    tokens = {user.username: ApiToken.issue(user, "fuzz")[1] for user in (annotator, researcher)}
    return {"project": project, "ids": ids, "tokens": tokens, "snapshot": snapshot.pk}


def _path_parameters(operation, world, existing: bool) -> dict:
    path = operation.path
    values = {}
    if "{project_pk}" in path:
        values["project_pk"] = world["project"].pk
    if "{snapshot_pk}" in path and existing:
        values["snapshot_pk"] = world["snapshot"]
    if "{id}" in path and existing:
        resource = path.split("{project_pk}/", 1)[1].split("/", 1)[0]
        if world["ids"].get(resource) is not None:
            values["id"] = world["ids"][resource]
    return values


def fuzz(world, role: str, examples: int) -> dict:
    """Drive every operation as `role`; returns the case counts and every failure found."""
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    # Django's application itself: feedback_app.wsgi would also freeze every object this test process holds.
    application = get_wsgi_application()

    # As Django's test client does: a request's end must not close the test's database connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        return _fuzz(world, role, examples, application)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _fuzz(world, role: str, examples: int, application) -> dict:
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
    headers = {"Authorization": f"Bearer {world['tokens'][role]}"}
    report = {"role": role, "cases": 0, "statuses": Counter(), "failures": [], "no_negative_cases": []}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for existing in (True, False):
                label = f"{operation.label} ({mode.value})"
                fixed = _path_parameters(operation, world, existing)
                if mode == GenerationMode.NEGATIVE and not _has_free_input(operation, fixed):
                    # Nothing of the operation is left to break (every parameter fixed, no body): no such case. Asked
                    # for one, hypothesis would draw a thousand times before it gave up.
                    report["no_negative_cases"].append(label)
                    continue
                strategy = operation.as_strategy(mode, path_parameters=fixed, headers=headers)
                try:
                    _drive(strategy, examples, headers, label, report)
                except Unsatisfiable:
                    report["no_negative_cases"].append(label)
    report["statuses"] = dict(report["statuses"])
    return report


def _has_free_input(operation, fixed: dict) -> bool:
    """Whether a request to `operation` has anything the fuzzer chooses: a query parameter, a body, or a path
    parameter that `fixed` does not set (the Authorization header is always set)."""
    unset = {parameter.name for parameter in operation.path_parameters} - set(fixed)
    return bool(unset or list(operation.query) or list(operation.body))


def _drive(strategy, examples: int, headers: dict, label: str, report: dict) -> None:
    """Send `examples` cases of one operation and record each response's status and every failed check."""
    from django.core.cache import cache
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

    checks = [not_a_server_error, response_schema_conformance, content_type_conformance]

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def drive(case) -> None:
        cache.clear()  # throttle counts: the fuzzer sends far more than a client's hourly share
        report["cases"] += 1
        logged = len(errors)
        response = case.call(headers=headers)
        report["statuses"][response.status_code] += 1
        try:
            case.validate_response(response, checks=checks)
        except (Exception, BaseExceptionGroup) as exc:  # every failed check is recorded, then reported
            request = f"{case.method} {case.formatted_path} query={case.query} body={case.body!r}"
            report["failures"].append(
                {
                    "operation": label,
                    "status": response.status_code,
                    "request": request[:600],
                    "failure": str(exc)[:800],
                    "server_error": "\n".join(errors[logged:])[-1500:],
                }
            )

    with _server_errors() as errors:
        drive()


@contextmanager
def _server_errors():
    """The tracebacks the server logged, last lines first, so a failure names its cause and not only its status."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                lines = "".join(traceback.format_exception(*record.exc_info)).strip().splitlines()
                records.append("\n".join(lines[-6:]))

    handler = Keep(level=logging.ERROR)
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("role", ROLES)
def test_no_input_makes_a_server_error_or_breaks_the_schema(world, role):
    report = fuzz(world, role, EXAMPLES)
    target = os.environ.get("TANDEM_FUZZ_REPORT")
    if target:
        path = Path(target)
        previous = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**previous, role: report}, indent=2) + "\n")
    assert report["cases"] >= 68 * 4  # every operation ran in both modes against both kinds of id
    assert report["failures"] == [], json.dumps(report["failures"][:20], indent=2)
