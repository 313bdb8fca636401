"""Labels of every kind, stored through the same functions as the annotator pages (`feedback_app.labelling`).

Append-only: POST stores a label by the caller (or, for an item the caller already labelled, a new revision of that
label), PUT/PATCH store a new revision, and nothing is ever overwritten or deleted. A retried POST or PATCH with the
same `client_token` returns the stored label with 200 instead of storing a second one.

An annotator sees only their own labels; researchers and admins see every label in their projects.
"""

from __future__ import annotations

from contextlib import contextmanager

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q
from django.shortcuts import get_object_or_404
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from feedback_app import labelling
from feedback_app.api.base import ALL_ROLES, Conflict, ProjectScopedMixin
from feedback_app.api.filtering import TandemFilterSet
from feedback_app.api.schema import ErrorSerializer
from feedback_app.api.serializers import labels as s
from feedback_app.models import Comparison, Critique, Intervention, Rating, StepLabel
from feedback_app.queue import LeaseLost


class LabelFilter(TandemFilterSet):
    revisions = filters.ChoiceFilter(
        choices=[("current", "current"), ("all", "all")],
        method="filter_revisions",
        help_text="current (the default): only the latest revision of each label; all: every revision.",
    )
    annotator = filters.NumberFilter(field_name="annotator", help_text="A user id (researchers and admins).")
    created_after = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    def filter_revisions(self, queryset, name, value):
        return queryset  # applied in filter_queryset, so that "current" is also the default

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        return queryset if self.form.cleaned_data.get("revisions") == "all" else queryset.filter(is_current=True)


class ComparisonFilter(LabelFilter):
    trajectory = filters.NumberFilter(method="filter_trajectory", help_text="Either side of the pair.")

    class Meta:
        model = Comparison
        fields = ["choice"]

    def filter_trajectory(self, queryset, name, value):
        return queryset.filter(Q(trajectory_a=value) | Q(trajectory_b=value))


class StepLabelFilter(LabelFilter):
    trajectory = filters.NumberFilter(field_name="step__trajectory")

    class Meta:
        model = StepLabel
        fields = ["step", "value"]


class CritiqueFilter(LabelFilter):
    class Meta:
        model = Critique
        fields = ["trajectory", "step"]


class RatingFilter(LabelFilter):
    class Meta:
        model = Rating
        fields = ["trajectory", "thumb_up", "score"]


class InterventionFilter(LabelFilter):
    class Meta:
        model = Intervention
        fields = ["trajectory", "step", "status"]


CONFLICT = OpenApiResponse(
    ErrorSerializer,
    description="POST: the assignment's lease was lost and its item has all its labels. PUT/PATCH: this revision "
    "was already superseded.",
)
NOT_YOURS = OpenApiResponse(ErrorSerializer, description="Only the label's own annotator may revise it.")


def _label_schema(noun: str, serializer, revision_serializer):
    return extend_schema_view(
        list=extend_schema(
            summary=f"{noun}s, newest first (annotators: only their own)",
            description="Only current revisions unless `revisions=all`.",
        ),
        retrieve=extend_schema(summary=f"One {noun.lower()} revision"),
        create=extend_schema(
            summary=f"Store a {noun.lower()} by the caller",
            description="The annotator is always the caller. A retry with the same `client_token` returns the stored "
            "label with 200. An item the caller already labelled gets a new revision of that label (201), or the "
            "label itself with 200 when nothing differs, as on the annotator pages.",
            responses={201: serializer, 200: serializer, 409: CONFLICT},
        ),
        update=extend_schema(
            summary=f"Revise a {noun.lower()}: stores a new revision",
            description="Never overwrites: the response is the new revision, with a new id, and the old one stays "
            "stored with is_current false. What the label is about cannot change.",
            request=revision_serializer,
            responses={200: serializer, 403: NOT_YOURS, 409: CONFLICT},
        ),
        partial_update=extend_schema(
            summary=f"Revise some fields of a {noun.lower()}: stores a new revision",
            description="As PUT, with only the fields to change.",
            request=revision_serializer,
            responses={200: serializer, 403: NOT_YOURS, 409: CONFLICT},
        ),
    )


class LabelViewSet(
    ProjectScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Every member may label; what each sees and may change is decided per label below."""

    write_roles = ALL_ROLES
    http_method_names = ["get", "post", "put", "patch", "head", "options"]
    model: type
    revision_serializer_class: type
    related: tuple[str, ...] = ("annotator",)

    def get_queryset(self):
        if self.is_schema_view:
            return self.model.objects.none()
        labels = self.model.objects.filter(project=self.project).select_related(*self.related)
        if not self.membership.can_manage:
            labels = labels.filter(annotator=self.request.user)
        return labels

    def get_object(self):
        # Any revision can be read (and revising a superseded one is a 409), so the list's "current only" filter
        # does not apply here.
        label = get_object_or_404(self.get_queryset(), pk=self.kwargs["pk"])
        self.check_object_permissions(self.request, label)
        return label

    def get_serializer_class(self):
        return self.revision_serializer_class if self.action in ("update", "partial_update") else self.serializer_class

    def create(self, request, *args, **kwargs) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with _as_api_errors():
            stored = self.submit(request.user, dict(serializer.validated_data))
        return self._respond(stored.label, status.HTTP_201_CREATED if stored.created else status.HTTP_200_OK)

    def update(self, request, *args, **kwargs) -> Response:
        label = self.get_object()
        if label.annotator_id != request.user.pk:  # before the body is read: someone else's label is not theirs to fix
            raise PermissionDenied("Only the annotator who made a label may revise it.")
        serializer = self.get_serializer(label, data=request.data, partial=kwargs.get("partial", False))
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        if not set(changes) & set(self.model.content_fields):
            writable = [name for name in self.model.content_fields if not serializer.fields[name].read_only]
            raise ValidationError({"non_field_errors": [f"Give at least one of {writable} to revise."]})
        with _as_api_errors():
            revised = labelling.edit_label(request.user, label, **changes)
        return self._respond(revised)

    def submit(self, user, data: dict) -> labelling.Stored:
        """Store a new label of this kind from validated data, through `feedback_app.labelling`."""
        raise NotImplementedError

    def _respond(self, label, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.serializer_class(label, context=self.get_serializer_context()).data, status=code)


@contextmanager
def _as_api_errors():
    """The label service's refusals as the API's: 400 naming the field, 403, or 409 for a lost lease or a stale
    revision."""
    try:
        yield
    except labelling.StaleEdit as exc:
        raise Conflict(" ".join(exc.messages)) from None
    except DjangoValidationError as exc:
        raise ValidationError(_django_errors(exc)) from None
    except DjangoPermissionDenied as exc:
        raise PermissionDenied(str(exc)) from None
    except LeaseLost as exc:
        raise Conflict(str(exc)) from None


def _step_in(trajectory, step):
    """The step's index, refused when the step belongs to another trajectory."""
    if step.trajectory_id != trajectory.pk:
        raise DjangoValidationError({"step": f"Step {step.pk} belongs to another trajectory than {trajectory.pk}."})
    return step.index


def _django_errors(exc: DjangoValidationError) -> dict | list:
    return exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}


@_label_schema("Comparison", s.ComparisonSerializer, s.ComparisonRevisionSerializer)
class ComparisonViewSet(LabelViewSet):
    model = Comparison
    serializer_class = s.ComparisonSerializer
    revision_serializer_class = s.ComparisonRevisionSerializer
    filterset_class = ComparisonFilter

    def submit(self, user, data: dict) -> labelling.Stored:
        return labelling.compare(
            user,
            data["trajectory_a"],
            data["trajectory_b"],
            choice=data["choice"],
            strength=data.get("strength", 2),
            rationale=data.get("rationale", ""),
            order=data.get("displayed_order", "ab"),
            **_common(data),
        )


@_label_schema("Step label", s.StepLabelSerializer, s.StepLabelRevisionSerializer)
class StepLabelViewSet(LabelViewSet):
    model = StepLabel
    serializer_class = s.StepLabelSerializer
    revision_serializer_class = s.StepLabelRevisionSerializer
    filterset_class = StepLabelFilter
    related = ("annotator", "step")

    def submit(self, user, data: dict) -> labelling.Stored:
        step = data["step"]
        return labelling.label_step(user, step.trajectory, step.index, data["value"], **_common(data))


@_label_schema("Critique", s.CritiqueSerializer, s.CritiqueRevisionSerializer)
class CritiqueViewSet(LabelViewSet):
    model = Critique
    serializer_class = s.CritiqueSerializer
    revision_serializer_class = s.CritiqueRevisionSerializer
    filterset_class = CritiqueFilter

    def submit(self, user, data: dict) -> labelling.Stored:
        trajectory, step = data["trajectory"], data.get("step")
        return labelling.add_critique(
            user,
            trajectory,
            text=data["text"],
            step_index=None if step is None else _step_in(trajectory, step),
            span_field=data.get("span_field", ""),
            span_start=data.get("span_start"),
            span_end=data.get("span_end"),
            tags=data.get("tags"),
            **_common(data),
        )


@_label_schema("Rating", s.RatingSerializer, s.RatingRevisionSerializer)
class RatingViewSet(LabelViewSet):
    model = Rating
    serializer_class = s.RatingSerializer
    revision_serializer_class = s.RatingRevisionSerializer
    filterset_class = RatingFilter

    def submit(self, user, data: dict) -> labelling.Stored:
        return labelling.rate(
            user,
            data["trajectory"],
            score=data.get("score"),
            thumb_up=data.get("thumb_up"),
            comment=data.get("comment", ""),
            **_common(data),
        )


@_label_schema("Intervention", s.InterventionSerializer, s.InterventionRevisionSerializer)
class InterventionViewSet(LabelViewSet):
    model = Intervention
    serializer_class = s.InterventionSerializer
    revision_serializer_class = s.InterventionRevisionSerializer
    filterset_class = InterventionFilter

    def submit(self, user, data: dict) -> labelling.Stored:
        trajectory = data["trajectory"]
        return labelling.intervene(
            user,
            trajectory,
            step_index=_step_in(trajectory, data["step"]),
            corrected_action=data.get("corrected_action", ""),
            corrected_reasoning=data.get("corrected_reasoning", ""),
            corrected_message=data.get("corrected_message"),
            takeover_actions=data.get("takeover_actions"),
            reason=data.get("reason", ""),
            **_common(data),
        )


def _common(data: dict) -> dict:
    """What every kind's submit takes besides its own fields."""
    return {name: data.get(name) for name in ("assignment", "client_token", "seconds_spent")}
