"""The annotation queue over the API: lease the next item, give it back, hand in a step-label item.

The same functions as the annotator pages (feedback_app.queue and feedback_app.labelling), so a script or a
simulated annotator gets the same items, gold mixing, leases and left/right order as a person in the browser. Any
member may label; each acts only on their own assignments (anyone else's is a 404).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response

from feedback_app import labelling, queue
from feedback_app.api.base import ALL_ROLES, Conflict, ProjectScopedMixin
from feedback_app.api.schema import ErrorSerializer
from feedback_app.api.serializers.trajectories import (
    AssignmentSerializer,
    LeasedAssignmentSerializer,
    NextItemSerializer,
    SkipSerializer,
)
from feedback_app.models import Assignment
from feedback_app.models.queue import AssignmentStatus


class QueueViewSet(ProjectScopedMixin, viewsets.GenericViewSet):
    """Routes under assignments/ beside the read-only list (feedback_app.api.runs.AssignmentViewSet)."""

    read_roles = ALL_ROLES
    write_roles = ALL_ROLES
    serializer_class = AssignmentSerializer

    def get_queryset(self):
        if self.is_schema_view:
            return Assignment.objects.none()
        return Assignment.objects.filter(item__project=self.project, annotator=self.request.user).select_related(
            "item", "item__trajectory"
        )

    def get_object(self) -> Assignment:
        assignment = get_object_or_404(self.get_queryset(), pk=self.kwargs["pk"])
        assignment.item.project = self.project
        return assignment

    @extend_schema(
        summary="Lease the next item to label (the current lease if you hold one)",
        description="Takes the item from the project's queue as the annotator pages do: your unexpired lease first "
        "(so a retry resumes it), else the highest-priority open item, with gold items mixed in unannounced. The "
        "lease lasts the project's `lease_minutes` (`leased_until`). Answer it by POSTing a label with "
        "`assignment` set (a step_label item: its step labels, then `assignments/<id>/finish/`), or give it back "
        "with `assignments/<id>/skip/`. For a comparison, `trajectories` is [left, right] as shown.",
        request=NextItemSerializer,
        responses={
            200: LeasedAssignmentSerializer,
            204: OpenApiResponse(description="Nothing is left for you (of this kind)."),
        },
    )
    @action(detail=False, methods=["post"], url_path="next")
    def lease_next(self, request, *args, **kwargs) -> Response:
        ask = NextItemSerializer(data=request.data)
        ask.is_valid(raise_exception=True)
        assignment = queue.next_assignment(request.user, self.project, kind=ask.validated_data.get("kind") or None)
        if assignment is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        assignment.item.project = self.project
        return Response(LeasedAssignmentSerializer(assignment, context=self.get_serializer_context()).data)

    @extend_schema(
        summary="Give an item back, with a reason",
        description="The slot is free for others and you will not be given the item again. Skipping twice changes "
        "nothing.",
        request=SkipSerializer,
        responses={
            200: AssignmentSerializer,
            409: OpenApiResponse(ErrorSerializer, description="The item is already labelled."),
        },
    )
    @action(detail=True, methods=["post"])
    def skip(self, request, *args, **kwargs) -> Response:
        assignment = self.get_object()
        given = SkipSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        if assignment.status == AssignmentStatus.DONE:
            raise Conflict(f"Assignment {assignment.pk} is already labelled and cannot be skipped.")
        if assignment.status != AssignmentStatus.SKIPPED:
            queue.skip(assignment, given.validated_data["reason"].strip())
        return Response(self.get_serializer(assignment).data)

    @extend_schema(
        summary="Hand in a step_label item once its steps are labelled",
        description="As the step page's Finish: every step up to the first -1 (every step if none is -1) needs a "
        "current step label by you. Handing in twice changes nothing.",
        request=None,
        responses={
            200: AssignmentSerializer,
            409: OpenApiResponse(
                ErrorSerializer,
                description="You skipped the item, or your lease expired and others have since labelled it.",
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def finish(self, request, *args, **kwargs) -> Response:
        assignment = self.get_object()
        if assignment.status == AssignmentStatus.SKIPPED:
            raise Conflict(f"Assignment {assignment.pk} was skipped; it cannot be handed in.")
        try:
            labelling.finish_step_labels(request.user, assignment)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        except queue.LeaseLost as exc:
            raise Conflict(str(exc)) from None
        return Response(self.get_serializer(assignment).data)
