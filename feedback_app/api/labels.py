"""Labels of every kind. Append-only: POST stores a label by the caller, PUT/PATCH store a new revision through the
model's revise(), and nothing is ever overwritten or deleted.

An annotator sees only their own labels; researchers and admins see every label in their projects. A retried POST
with the same `client_token` returns the stored label with 200 instead of storing a second one.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.shortcuts import get_object_or_404
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from feedback_app.api import serializers as s
from feedback_app.api.base import ALL_ROLES, Conflict, ProjectScopedMixin
from feedback_app.api.filtering import TandemFilterSet
from feedback_app.api.schema import ErrorSerializer
from feedback_app.interventions import turn_message, validate_correction
from feedback_app.models import Comparison, Critique, FeedbackKind, Intervention, Rating, StepLabel
from feedback_app.models.labels import StaleRevision
from feedback_app.queue import LeaseLost, complete
from reward_models.conversation import message_tool_calls
from reward_models.envs.base import describe_message
from training import launch

STEP_PAGE_KINDS = {FeedbackKind.STEP_LABEL, FeedbackKind.CRITIQUE, FeedbackKind.RATING, FeedbackKind.INTERVENTION}


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
    description="POST: you already have a current label of this item (revise it instead). PUT/PATCH: this revision "
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
            "label with 200.",
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
    kind: str
    revision_serializer_class: type
    # Labels without a one-current-per-item rule (critiques: many per item) set this to False.
    one_per_item = True
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
        if self.kind not in self.project.feedback_kinds:
            raise ValidationError({"non_field_errors": [f"This project does not collect {self.kind} labels."]})
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token = serializer.validated_data.get("client_token")
        stored = self._stored_for_token(token)
        if stored is not None:
            return self._respond(stored)
        label = self.model(project=self.project, annotator=request.user, **self.prepare(serializer.validated_data))
        if label.assignment is not None:
            self._check_assignment(label)
            label.query_strategy = label.assignment.item.query_strategy
        self._clean(label)
        self._refuse_second_current(label)
        try:
            with transaction.atomic():
                label.save()
                if label.assignment is not None and label.assignment.item.kind != FeedbackKind.STEP_LABEL:
                    # A step_label item is handed in with assignments/<id>/finish/ once its steps are labelled.
                    complete(label.assignment)
        except IntegrityError:
            # A concurrent retry stored the same client_token, or a concurrent submit labelled the same item.
            stored = self._stored_for_token(token)
            if stored is not None:
                return self._respond(stored)
            self._refuse_second_current(label)
            raise
        except LeaseLost as exc:
            raise Conflict(str(exc)) from None
        self.stored(label)
        return self._respond(label, status.HTTP_201_CREATED)

    def update(self, request, *args, **kwargs) -> Response:
        label = self.get_object()
        if label.annotator_id != request.user.pk:
            raise PermissionDenied("Only the annotator who made a label may revise it.")
        serializer = self.get_serializer(label, data=request.data, partial=kwargs.get("partial", False))
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        stored = self._stored_for_token(changes.get("client_token"))
        if stored is not None:
            return self._respond(stored)
        if not set(changes) & set(self.model.content_fields):
            writable = [name for name in self.model.content_fields if not serializer.fields[name].read_only]
            raise ValidationError({"non_field_errors": [f"Give at least one of {writable} to revise."]})
        try:
            revised = label.revise(**changes)
        except StaleRevision:
            raise Conflict(
                f"{self.model.__name__} {label.pk} was already revised; revise its current revision."
            ) from None
        except DjangoValidationError as exc:
            raise ValidationError(_django_errors(exc)) from None
        self.revised(label, revised)
        return self._respond(revised)

    # Hooks for one kind of label.

    def prepare(self, data: dict) -> dict:
        """The model fields of a new label from validated data."""
        return dict(data)

    def check(self, label) -> None:
        """Checks beyond the model's own clean(); raise Django's ValidationError."""

    def item_trajectory_ids(self, label) -> set[int]:
        return {label.trajectory_id}

    def stored(self, label) -> None:
        """After a new label is stored."""

    def revised(self, old, new) -> None:
        """After a new revision is stored."""

    def _respond(self, label, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.serializer_class(label, context=self.get_serializer_context()).data, status=code)

    def _check_assignment(self, label) -> None:
        item = label.assignment.item
        # A step_label item is reviewed as on the step page: its critiques, ratings and interventions answer it too.
        kinds = STEP_PAGE_KINDS if item.kind == FeedbackKind.STEP_LABEL else {item.kind}
        if self.kind not in kinds or {item.trajectory_id, item.other_trajectory_id} - {None} != (
            self.item_trajectory_ids(label)
        ):
            raise ValidationError({"assignment": ["This assignment is for another item."]})

    def _stored_for_token(self, token):
        if token is None:
            return None
        stored = self.model.objects.filter(annotator=self.request.user, client_token=token).first()
        if stored is not None and stored.project_id != self.project.pk:
            raise ValidationError({"client_token": ["This token was already used for a label in another project."]})
        return stored

    def _clean(self, label) -> None:
        try:
            label.full_clean(exclude=["supersedes", "assignment"], validate_unique=False, validate_constraints=False)
            self.check(label)
        except DjangoValidationError as exc:
            raise ValidationError(_django_errors(exc)) from None

    def _refuse_second_current(self, label) -> None:
        if not self.one_per_item:
            return
        item = {name: getattr(label, name) for name in self.model.item_fields if name != "displayed_order"}
        current = self.model.objects.filter(annotator=label.annotator, is_current=True, **item).first()
        if current is not None:
            raise Conflict(
                f"You already labelled this item: revise {self.model.__name__.lower()} {current.pk} with PATCH."
            )


def _django_errors(exc: DjangoValidationError) -> dict | list:
    return exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}


@_label_schema("Comparison", s.ComparisonSerializer, s.ComparisonRevisionSerializer)
class ComparisonViewSet(LabelViewSet):
    model = Comparison
    kind = FeedbackKind.COMPARISON
    serializer_class = s.ComparisonSerializer
    revision_serializer_class = s.ComparisonRevisionSerializer
    filterset_class = ComparisonFilter

    def item_trajectory_ids(self, label) -> set[int]:
        return {label.trajectory_a_id, label.trajectory_b_id}


@_label_schema("Step label", s.StepLabelSerializer, s.StepLabelRevisionSerializer)
class StepLabelViewSet(LabelViewSet):
    model = StepLabel
    kind = FeedbackKind.STEP_LABEL
    serializer_class = s.StepLabelSerializer
    revision_serializer_class = s.StepLabelRevisionSerializer
    filterset_class = StepLabelFilter
    related = ("annotator", "step")

    def item_trajectory_ids(self, label) -> set[int]:
        return {label.step.trajectory_id}


@_label_schema("Critique", s.CritiqueSerializer, s.CritiqueRevisionSerializer)
class CritiqueViewSet(LabelViewSet):
    model = Critique
    kind = FeedbackKind.CRITIQUE
    serializer_class = s.CritiqueSerializer
    revision_serializer_class = s.CritiqueRevisionSerializer
    filterset_class = CritiqueFilter
    one_per_item = False


@_label_schema("Rating", s.RatingSerializer, s.RatingRevisionSerializer)
class RatingViewSet(LabelViewSet):
    model = Rating
    kind = FeedbackKind.RATING
    serializer_class = s.RatingSerializer
    revision_serializer_class = s.RatingRevisionSerializer
    filterset_class = RatingFilter


@_label_schema("Intervention", s.InterventionSerializer, s.InterventionRevisionSerializer)
class InterventionViewSet(LabelViewSet):
    model = Intervention
    kind = FeedbackKind.INTERVENTION
    serializer_class = s.InterventionSerializer
    revision_serializer_class = s.InterventionRevisionSerializer
    filterset_class = InterventionFilter

    def prepare(self, data: dict) -> dict:
        step = data["step"]
        env = self.project.environment.load()
        corrected = data.get("corrected_message") or turn_message(
            env, data.get("corrected_action", ""), data.get("corrected_reasoning", "")
        )
        reasoning, action = describe_message(env, corrected, message_tool_calls(corrected))
        return {
            **data,
            "corrected_message": corrected,
            "corrected_action": data.get("corrected_action") or action,
            "corrected_reasoning": data.get("corrected_reasoning") or reasoning,
            "original_message": step.message,
            "original_action": step.action,
            "original_reasoning": step.reasoning,
        }

    def check(self, label: Intervention) -> None:
        # The corrected turn (and any takeover) must be playable in the environment, as on the annotator page.
        env = self.project.environment.load()
        takeover = [turn_message(env, turn) for turn in label.takeover_actions]
        validate_correction(label.trajectory, label.step.index, label.corrected_message, takeover)

    def stored(self, label: Intervention) -> None:
        launch.send_continuation(label.pk)

    def revised(self, old: Intervention, new: Intervention) -> None:
        # The action is unchanged, so the continuation made for the old revision stands for the new one.
        new.status, new.child_trajectory_id, new.error = old.status, old.child_trajectory_id, old.error
        new.save(update_fields=["status", "child_trajectory", "error"])
