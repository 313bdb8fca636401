"""What every view under /api/projects/{project_pk}/ shares: the project is fetched through feedback_app.access
before anything else, so an outsider gets 404 (never a hint that the project exists) and a member without the
role gets 403."""

from __future__ import annotations

from django.db.models import Model, QuerySet
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import APIException
from rest_framework.permissions import SAFE_METHODS

from feedback_app.access import MANAGER_ROLES, get_project_for_role, sees_outcomes
from feedback_app.models import Role

ALL_ROLES = (Role.ANNOTATOR, Role.RESEARCHER, Role.ADMIN)


class ThrottleAfterAccessMixin:
    """DRF counts a request against the rate limits in `initial()`, before a view has fetched its project, so an
    outsider over the limit would get 429 where every outsider must get 404. A view with this mixin is throttled
    once its access check has passed: it calls `access_checked(request)` right after it."""

    _access_checked = False

    def check_throttles(self, request) -> None:
        if self._access_checked:
            super().check_throttles(request)

    def access_checked(self, request) -> None:
        self._access_checked = True
        self.check_throttles(request)


class ProjectScopedMixin(ThrottleAfterAccessMixin):
    """Sets `self.project` and `self.membership`. Roles per method come from `read_roles` / `write_roles`, or per
    action from `roles_for_action` (e.g. {"cancel": MANAGER_ROLES})."""

    lookup_value_converter = "int"
    read_roles: tuple[str, ...] = ALL_ROLES
    write_roles: tuple[str, ...] = MANAGER_ROLES
    roles_for_action: dict[str, tuple[str, ...]] = {}

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        self.project, self.membership = get_project_for_role(request, kwargs["project_pk"], *self.required_roles())
        self.access_checked(request)

    def required_roles(self) -> tuple[str, ...]:
        action = getattr(self, "action", None)
        if action in self.roles_for_action:
            return self.roles_for_action[action]
        return self.read_roles if self.request.method in SAFE_METHODS else self.write_roles

    @property
    def is_schema_view(self) -> bool:
        """drf-spectacular builds views without a request to read their serializers and querysets."""
        return getattr(self, "swagger_fake_view", False)

    @property
    def sees_outcomes(self) -> bool:
        return self.is_schema_view or sees_outcomes(self.membership)

    def get_serializer_context(self) -> dict:
        context = super().get_serializer_context()
        if not self.is_schema_view:
            context.update(project=self.project, membership=self.membership)
        return context

    def project_rows(self, model: type[Model]) -> QuerySet:
        """`model`'s rows in this view's project; none for the schema view, which has no project."""
        if self.is_schema_view:
            return model.objects.none()
        return model.objects.filter(project=self.project)


class ProjectListCreateViewSet(
    ProjectScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """A project's rows, listed, read one at a time and created; never changed or deleted through the API."""


class HiddenFieldsMixin:
    """Drops the fields in `Meta.outcome_fields` for members who may not see outcomes (see access.sees_outcomes),
    and `Meta.policy_fields` too when the project is blind. Without a membership in the context (the schema, or a
    researcher-only view) every field is kept."""

    def get_fields(self) -> dict:
        fields = super().get_fields()
        membership = self.context.get("membership")
        if membership is None or sees_outcomes(membership):
            return fields
        hidden = set(getattr(self.Meta, "outcome_fields", ()))
        if membership.project.blind:
            hidden |= set(getattr(self.Meta, "policy_fields", ()))
        return {name: field for name, field in fields.items() if name not in hidden}


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "This conflicts with the stored data."
    default_code = "conflict"


class ImportSummarySerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="Rows stored by this request.")
    skipped = serializers.IntegerField(help_text="Rows whose external_id was already stored (a retried import).")
