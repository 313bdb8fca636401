"""Bulk import of trajectories and of existing preference labels: streamed, validated row by row, atomic.

The body is read as a stream (never parsed whole by DRF) and handed to feedback_app.imports, which validates and
writes it in batches inside one transaction. Its size is checked from Content-Length before reading and again
while reading.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, UnsupportedMediaType
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from feedback_app.access import MANAGER_ROLES
from feedback_app.api.base import ImportSummarySerializer, ProjectScopedMixin
from feedback_app.api.schema import ErrorSerializer, ImportRejectedSerializer
from feedback_app.imports import (
    BodyTooLarge,
    ImportRejected,
    import_preference_stream,
    import_trajectory_stream,
    iter_json_rows,
)
from feedback_app.trajectory_schema import PreferenceImportSerializer, TrajectoryImportSerializer

JSON_ARRAY = "application/json"
JSON_LINES = ("application/x-ndjson", "application/jsonl")


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"

    def __init__(self, limit: int, size: int | None = None) -> None:
        body = f"The body is {size} bytes" if size is not None else "The body is too large"
        super().__init__(
            f"{body}; an import may have at most {limit} bytes ({limit / 2**20:.1f} MiB, set by "
            "TANDEM_IMPORT_MAX_BYTES). Split the file and import the parts one after another: rows already "
            "stored are skipped, so the parts may overlap."
        )


def import_body(request):
    """The request body as a byte stream, after checking its media type and declared size."""
    media_type = request.content_type.split(";")[0].strip().lower()
    if media_type not in (JSON_ARRAY, *JSON_LINES):
        raise UnsupportedMediaType(
            media_type,
            detail=f"Send the rows as {JSON_ARRAY} (an array, or one object a line) or as {' or '.join(JSON_LINES)} "
            f"(one object a line), not {media_type or 'a body without Content-Type'}.",
        )
    limit = settings.TANDEM_IMPORT_MAX_BYTES
    try:
        size = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ParseError("Content-Length must be a number of bytes.") from None
    if size > limit:
        raise PayloadTooLarge(limit, size)
    if request.stream is None:
        raise ParseError("The body is empty: send at least one row.")
    return request.stream


def run_import(do_import) -> Response:
    limit = settings.TANDEM_IMPORT_MAX_BYTES
    try:
        result = do_import()
    except BodyTooLarge:
        raise PayloadTooLarge(limit) from None
    except ImportRejected as exc:
        first = f" First: {exc.errors[0]}." if exc.errors else ""
        return Response(
            {
                "detail": f"{exc.total_bad} bad row(s); nothing was imported.{first}",
                "bad_rows": exc.total_bad,
                "errors": [{"row": e.row, "field": e.field, "reason": e.reason} for e in exc.errors],
            },
            status=status.HTTP_400_BAD_REQUEST,
        )
    return Response({"created": result.created, "skipped": result.skipped_existing})


IMPORT_ERRORS = {
    400: OpenApiResponse(
        ImportRejectedSerializer,
        description="At least one bad row (or malformed JSON, naming the line); nothing was stored. Lists each bad "
        "row's number, field and reason, at most the first 100.",
    ),
    413: OpenApiResponse(ErrorSerializer, description="The body is larger than TANDEM_IMPORT_MAX_BYTES."),
    415: OpenApiResponse(ErrorSerializer, description="The Content-Type is not JSON or JSON Lines."),
}


def _request_schema(row_serializer) -> dict:
    return {
        JSON_ARRAY: row_serializer(many=True),
        **{media_type: row_serializer for media_type in JSON_LINES},
    }


class ImportView(ProjectScopedMixin, APIView):
    write_roles = MANAGER_ROLES
    throttle_scope = "imports"
    throttle_classes = [*APIView.throttle_classes, ScopedRateThrottle]


class TrajectoryImportView(ImportView):
    @extend_schema(
        summary="Import trajectories (researchers and admins)",
        description="A JSON array of trajectory rows, or JSON Lines (one row a line), up to TANDEM_IMPORT_MAX_BYTES "
        "(100 MiB by default). Each row has `steps`, or chat-style `messages` (each assistant message becomes a "
        "step). Every row is validated; if any is bad nothing is stored. Rows whose `external_id` is already "
        "stored are skipped, so a retried import duplicates nothing. Tasks are found or made by `task.external_id`"
        ", `task.seed` or instruction; policy names that are new become external policy versions.",
        request=_request_schema(TrajectoryImportSerializer),
        responses={200: ImportSummarySerializer, **IMPORT_ERRORS},
    )
    def post(self, request, project_pk: int) -> Response:
        stream = import_body(request)
        rows = iter_json_rows(stream, limit=settings.TANDEM_IMPORT_MAX_BYTES)
        return run_import(lambda: import_trajectory_stream(self.project, rows))


class PreferenceImportView(ImportView):
    @extend_schema(
        summary="Import existing preference labels (researchers and admins)",
        description="Rows of {prompt, chosen, rejected}: plain strings, or lists of chat messages as in TRL's "
        "conversational format (without `prompt`, chat-message answers share their longest common prefix as the "
        "prompt). Each prompt becomes a task, each answer an imported trajectory, and each row a comparison by the "
        "importing user or by the member named in `annotator` (query strategy `import`). `strength` is 1–3 "
        "(default 2); a `margin` is kept in both trajectories' metadata. The same validation, atomicity and "
        "idempotency as the trajectory import: `external_id` (or, without one, the row's content) makes a retry "
        "store nothing twice. `created` counts comparisons.",
        request=_request_schema(PreferenceImportSerializer),
        responses={200: ImportSummarySerializer, **IMPORT_ERRORS},
    )
    def post(self, request, project_pk: int) -> Response:
        stream = import_body(request)
        rows = iter_json_rows(stream, limit=settings.TANDEM_IMPORT_MAX_BYTES)
        return run_import(lambda: import_preference_stream(self.project, request.user, rows))
