"""Dataset exports (streamed JSONL or Parquet) and frozen snapshots, for researchers and admins.

The views only check access, parse the request and hand over to `feedback_app.exports`; the management command
`export_dataset` and training use the same functions.
"""

from __future__ import annotations

import base64
from pathlib import Path

from django.http import FileResponse, StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback_app import exports
from feedback_app.access import MANAGER_ROLES, get_project_for_role
from feedback_app.api.base import ThrottleAfterAccessMixin
from feedback_app.api.schema import ErrorSerializer, ValidationErrorSerializer
from feedback_app.exports.filters import parse_format, parse_kind
from feedback_app.models import DatasetSnapshot


class ExportNegotiation(DefaultContentNegotiation):
    """`?format=jsonl|parquet` is the export's own parameter, but DRF reads `format` as a renderer override and
    would answer 404 for a format no renderer has. The streamed body bypasses renderers anyway, so the renderer
    chosen here only writes errors: always JSON, whatever the Accept header asks for."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def _invalid(exc: exports.ExportRequestError) -> ValidationError:
    return ValidationError({name: [reason] for name, reason in exc.errors.items()})


# --- schema pieces -------------------------------------------------------------------------------------------------

STREAMED = OpenApiResponse(
    OpenApiTypes.BINARY,
    description="The export, streamed: JSON Lines (one row per line) or a Parquet file; `Content-Disposition` names "
    "it. The columns of each kind are listed in the docs' REST API and exports page (docs/data.md).",
)
# An export's or a snapshot's file: JSON Lines or Parquet.
FILE_MEDIA_TYPES = tuple(exports.MEDIA_TYPES.values())
INVALID = OpenApiResponse(ValidationErrorSerializer, description="A bad filter or kind; each bad field is named.")
FORBIDDEN = OpenApiResponse(ErrorSerializer, description="Only researchers and admins of the project may export.")
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such project (or snapshot) among the caller's projects.")


def _choices(enum) -> list[str]:
    return [choice.value for choice in enum]


FILTER_PARAMETERS = [
    OpenApiParameter(
        "since",
        OpenApiTypes.DATETIME,
        description="Labels created at or after (ISO 8601); in `returns`, trajectories created at or after.",
    ),
    OpenApiParameter(
        "until",
        OpenApiTypes.DATETIME,
        description="Labels (in `returns`, trajectories) created at or before; a date: all day.",
    ),
    OpenApiParameter(
        "annotators", OpenApiTypes.INT, many=True, description="Only these annotators' labels (ids). Not `returns`."
    ),
    OpenApiParameter(
        "policy_versions",
        OpenApiTypes.INT,
        many=True,
        description="Only rows whose every trajectory comes from one of these policy versions (ids).",
    ),
    OpenApiParameter(
        "sources",
        enum=["policy", "human", "import"],
        many=True,
        description="Only rows whose every trajectory has one of these sources (policy rollout, human, import).",
    ),
    OpenApiParameter(
        "min_agreement",
        OpenApiTypes.FLOAT,
        description="Only items whose labels agree at least this much (share holding the most common judgement, 0-1). "
        "Aggregated kinds only.",
    ),
    OpenApiParameter("exclude_gold", OpenApiTypes.BOOL, description="Leave out labels of gold items. Not `returns`."),
    OpenApiParameter(
        "aggregate",
        enum=_choices(exports.Aggregation),
        default=exports.Aggregation.MAJORITY.value,
        description="Several annotators of one item: majority (a tied vote gives no row), drop (only unanimous "
        "items) or all (one row per label).",
    ),
    OpenApiParameter(
        "neutral",
        enum=_choices(exports.Neutral),
        default=exports.Neutral.DROP.value,
        description="stepwise only: drop 0 step labels or count them as positive or negative.",
    ),
    OpenApiParameter(
        "style",
        enum=_choices(exports.Style),
        default=exports.Style.CONVERSATIONAL.value,
        description="Chat messages or plain-text transcripts (preference, step_preference, unpaired, critiques).",
    ),
    OpenApiParameter(
        "ties",
        enum=_choices(exports.Ties),
        default=exports.Ties.DROP.value,
        description="preference and step_preference only: drop tie verdicts, or include them as rows with "
        "`tie: true` (the pair in canonical order, margin 0). With include, every row has the boolean `tie` column; "
        "with drop, no row has it. Both-bad verdicts never make a row.",
    ),
    OpenApiParameter(
        "interventions",
        enum=_choices(exports.Interventions),
        default=exports.Interventions.INCLUDE.value,
        description="stepwise only: also export the step labels each intervention implies (steps before the "
        "intervened one accepted, the intervened one rejected), as separate rows with `source: intervention` after "
        "the rows of human step labels (`source: label`), or leave them out.",
    ),
]


# --- exports -------------------------------------------------------------------------------------------------------


class ExportView(ThrottleAfterAccessMixin, APIView):
    content_negotiation_class = ExportNegotiation
    renderer_classes = [JSONRenderer]

    @extend_schema(
        operation_id="export_dataset",
        summary="Stream a dataset export",
        description="Rows that TRL and `datasets` load as they are: `preference` (prompt/chosen/rejected), "
        "`step_preference`, `stepwise` (prompt/completions/labels), `unpaired` (prompt/completion/label), `sft` "
        "(messages), `critiques` (prompt/completion), `raw` (every label revision) and `returns` (one row per "
        "trajectory for a value critic: prompt, completions with one piece per step, the steps' environment "
        "`rewards` or null when none were recorded, `success`, trajectory_id, task_id, policy_version_id). Only "
        "current label revisions count, except in `raw`.",
        parameters=[
            OpenApiParameter("kind", str, OpenApiParameter.PATH, enum=_choices(exports.ExportKind)),
            OpenApiParameter("format", enum=_choices(exports.ExportFormat), default=exports.ExportFormat.JSONL.value),
            *FILTER_PARAMETERS,
        ],
        responses={
            (200, *FILE_MEDIA_TYPES): STREAMED,
            400: INVALID,
            403: FORBIDDEN,
            404: NOT_FOUND,
        },
    )
    def get(self, request, project_pk: int, kind: str) -> StreamingHttpResponse:
        project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
        self.access_checked(request)
        try:
            export_kind = parse_kind(kind)
            fmt = parse_format(request.query_params.get("format"))
            filters = exports.ExportFilters.from_query(request.query_params, other_names=["format"])
            filters.check_kind(export_kind)
        except exports.ExportRequestError as exc:
            raise _invalid(exc) from None
        response = StreamingHttpResponse(
            exports.export_chunks(project, export_kind, filters, fmt), content_type=exports.MEDIA_TYPES[fmt]
        )
        response["Content-Disposition"] = f'attachment; filename="{project.slug}-{export_kind}.{fmt}"'
        return response


# --- snapshots -----------------------------------------------------------------------------------------------------


class SnapshotSerializer(serializers.ModelSerializer):
    format = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = DatasetSnapshot
        fields = [
            "id",
            "project",
            "name",
            "export_kind",
            "format",
            "filters",
            "row_count",
            "content_hash",
            "created_by",
            "created_at",
            "download_url",
        ]
        read_only_fields = fields

    def get_format(self, snapshot: DatasetSnapshot) -> str:
        return exports.snapshot_format(snapshot).value

    def get_download_url(self, snapshot: DatasetSnapshot) -> str:
        return reverse("api-snapshot-download", args=[snapshot.pk])


class SnapshotDetailSerializer(SnapshotSerializer):
    class Meta(SnapshotSerializer.Meta):
        fields = [*SnapshotSerializer.Meta.fields, "row_ids"]
        read_only_fields = fields
        extra_kwargs = {"row_ids": {"help_text": "The stored rows it was made from, as `kind:id` (comparison:12)."}}


class SnapshotCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=DatasetSnapshot._meta.get_field("name").max_length)
    export_kind = serializers.ChoiceField(choices=_choices(exports.ExportKind))
    format = serializers.ChoiceField(choices=_choices(exports.ExportFormat), default=exports.ExportFormat.JSONL.value)
    filters = serializers.DictField(
        required=False, default=dict, help_text="The export's filters, as in the query string of the export endpoint."
    )

    def validate_filters(self, value: dict) -> exports.ExportFilters:
        try:
            return exports.ExportFilters.from_query(value)
        except exports.ExportRequestError as exc:
            raise serializers.ValidationError(exc.errors) from None


class SnapshotListView(ThrottleAfterAccessMixin, generics.GenericAPIView):
    serializer_class = SnapshotSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return DatasetSnapshot.objects.none()
        return DatasetSnapshot.objects.filter(project_id=self.kwargs["project_pk"]).select_related("created_by")

    @extend_schema(
        operation_id="list_snapshots",
        summary="A project's dataset snapshots, newest first",
        responses={200: SnapshotSerializer(many=True), 403: FORBIDDEN, 404: NOT_FOUND},
    )
    def get(self, request, project_pk: int) -> Response:
        get_project_for_role(request, project_pk, *MANAGER_ROLES)
        self.access_checked(request)
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        operation_id="create_snapshot",
        summary="Freeze a filtered export into a snapshot",
        description="Writes the export to a file under ARTIFACT_ROOT, hashing it (SHA-256) as it is written, and "
        "records the ids of the stored rows it was made from. Runs in the request: large exports take a while.",
        request=SnapshotCreateSerializer,
        responses={201: SnapshotDetailSerializer, 400: INVALID, 403: FORBIDDEN, 404: NOT_FOUND},
    )
    def post(self, request, project_pk: int) -> Response:
        project, _ = get_project_for_role(request, project_pk, *MANAGER_ROLES)
        self.access_checked(request)
        body = SnapshotCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            snapshot = exports.create_snapshot(
                project, data["export_kind"], data["filters"], user=request.user, name=data["name"], fmt=data["format"]
            )
        except exports.ExportRequestError as exc:
            # Filters that do not suit the kind are filter errors; a taken name is the name's.
            errors = {name: [reason] for name, reason in exc.errors.items() if name == "name"}
            nested = {name: [reason] for name, reason in exc.errors.items() if name != "name"}
            raise ValidationError({**errors, **({"filters": nested} if nested else {})}) from None
        return Response(SnapshotDetailSerializer(snapshot).data, status=status.HTTP_201_CREATED)


def _get_snapshot(view: ThrottleAfterAccessMixin, request, snapshot_pk: int) -> DatasetSnapshot:
    snapshot = DatasetSnapshot.objects.select_related("created_by").filter(pk=snapshot_pk).first()
    if snapshot is None:
        raise NotFound("No such snapshot.")
    get_project_for_role(request, snapshot.project_id, *MANAGER_ROLES)
    view.access_checked(request)
    return snapshot


class SnapshotDetailView(ThrottleAfterAccessMixin, APIView):
    @extend_schema(
        operation_id="get_snapshot",
        summary="One snapshot, with its content hash, row count and row ids",
        responses={200: SnapshotDetailSerializer, 403: FORBIDDEN, 404: NOT_FOUND},
    )
    def get(self, request, snapshot_pk: int) -> Response:
        return Response(SnapshotDetailSerializer(_get_snapshot(self, request, snapshot_pk)).data)


class SnapshotDownloadView(ThrottleAfterAccessMixin, APIView):
    content_negotiation_class = ExportNegotiation
    renderer_classes = [JSONRenderer]

    @extend_schema(
        operation_id="download_snapshot",
        summary="The snapshot's frozen file, byte for byte",
        description="Its SHA-256 equals the snapshot's `content_hash`, which is also sent as the ETag and in "
        "`Repr-Digest`.",
        responses={
            (200, *FILE_MEDIA_TYPES): OpenApiResponse(
                OpenApiTypes.BINARY, description="The file as it was written when the snapshot was made."
            ),
            403: FORBIDDEN,
            404: NOT_FOUND,
        },
    )
    def get(self, request, snapshot_pk: int) -> FileResponse:
        snapshot = _get_snapshot(self, request, snapshot_pk)
        try:
            stream = snapshot.open()
        except OSError:  # gone, or never written: the row outlived its file
            raise NotFound("The snapshot's file is missing from the artifact store.") from None
        response = FileResponse(
            stream,
            as_attachment=True,
            filename=Path(snapshot.path).name,
            content_type=exports.MEDIA_TYPES[exports.snapshot_format(snapshot)],
        )
        response["ETag"] = f'"{snapshot.content_hash}"'
        digest = base64.b64encode(bytes.fromhex(snapshot.content_hash)).decode()
        response["Repr-Digest"] = f"sha-256=:{digest}:"
        return response
