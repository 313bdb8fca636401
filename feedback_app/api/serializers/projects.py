"""Projects, their tasks and environments, and policy versions with their win rates."""

from __future__ import annotations

from django.utils.text import slugify
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from feedback_app.api.fields import (
    ProjectRelatedField,
    TandemModelSerializer,
    in_project,
)
from feedback_app.models import (
    EnvironmentSpec,
    FeedbackKind,
    PolicyVersion,
    Project,
    Task,
)
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.trajectories import PolicyKind
from feedback_app.win_rates import human_win_rate


class EnvironmentSpecSerializer(TandemModelSerializer):
    class Meta:
        model = EnvironmentSpec
        fields = ["name", "dotted_path", "config"]
        read_only_fields = fields


class ProjectSerializer(TandemModelSerializer):
    environment = serializers.SlugRelatedField(
        slug_field="name", queryset=EnvironmentSpec.objects.all(), help_text="The environment spec's name."
    )
    environment_spec = EnvironmentSpecSerializer(
        source="environment",
        read_only=True,
        help_text="How the environment is built: reward_models.envs.load_environment(dotted_path, config).",
    )
    feedback_kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=FeedbackKind.choices), allow_empty=False, required=False
    )
    role = serializers.SerializerMethodField(help_text="The caller's role in the project.")

    class Meta:
        model = Project
        fields = [
            "id",
            "name",
            "slug",
            "description",
            "guidelines",
            "environment",
            "environment_spec",
            "feedback_kinds",
            "overlap",
            "blind",
            "lease_minutes",
            "gold_fraction",
            "query_strategy",
            "role",
            "created_at",
        ]
        read_only_fields = ["slug", "created_at"]
        extra_kwargs = {
            "overlap": {"min_value": 1},
            "lease_minutes": {"min_value": 1},
            "gold_fraction": {"min_value": 0.0, "max_value": 1.0},
            "query_strategy": {
                "error_messages": {
                    "invalid_choice": '"{input}" is not a query strategy; choose one of '
                    + ", ".join(QueryStrategy.values)
                    + "."
                }
            },
        }

    def get_role(self, project: Project) -> str | None:
        roles = self.context.get("roles") or {}
        return roles.get(project.pk)

    def validate_name(self, value: str) -> str:
        slug = slugify(value)[:80]
        if not slug:
            raise serializers.ValidationError("The name needs at least one letter or digit (it makes the slug).")
        # The slug is made from the name once, on creation.
        if self.instance is None and Project.objects.filter(slug=slug).exists():
            raise serializers.ValidationError(f"A project with the slug {slug!r} already exists.")
        return value


# --- Tasks and policy versions ------------------------------------------------------------------------------------


class TaskSerializer(TandemModelSerializer):
    class Meta:
        model = Task
        fields = ["id", "instruction", "seed", "spec", "split", "external_id", "created_at"]
        read_only_fields = ["created_at"]

    def validate(self, attrs: dict) -> dict:
        for name in ("seed", "external_id"):
            value = attrs.get(name)
            if value is None:
                continue
            clash = in_project(self, Task, **{name: value})
            if self.instance is not None:
                clash = clash.exclude(pk=self.instance.pk)
            if clash.exists():
                raise serializers.ValidationError({name: f"Another task of this project has {name} {value!r}."})
        return attrs


class WinRateSerializer(serializers.Serializer):
    parent = serializers.IntegerField(help_text="The parent version it was compared against.")
    n = serializers.IntegerField(help_text="Current comparisons of one's trajectory against the other's.")
    wins = serializers.IntegerField()
    losses = serializers.IntegerField()
    ties = serializers.IntegerField(help_text="Ties and 'both bad', each counted half.")
    value = serializers.FloatField(allow_null=True, help_text="The share of comparisons the new version won.")
    low = serializers.FloatField(allow_null=True, help_text="Wilson 95 % interval, lower end.")
    high = serializers.FloatField(allow_null=True, help_text="Wilson 95 % interval, upper end.")


class PolicyVersionSerializer(TandemModelSerializer):
    parent = ProjectRelatedField(model=PolicyVersion, required=False, allow_null=True)
    human_win_rate = serializers.SerializerMethodField(
        help_text="How often annotators preferred this version over its parent (null without a parent)."
    )

    class Meta:
        model = PolicyVersion
        fields = [
            "id",
            "name",
            "kind",
            "weights_path",
            "endpoint_url",
            "endpoint_model",
            "generation",
            "parent",
            "produced_by",
            "notes",
            "created_at",
            "human_win_rate",
        ]
        read_only_fields = ["produced_by", "created_at"]

    @extend_schema_field(WinRateSerializer(allow_null=True))
    def get_human_win_rate(self, version: PolicyVersion) -> dict | None:
        known = self.context.get("win_rates", {})
        return known[version.pk] if version.pk in known else human_win_rate(version)

    def validate(self, attrs: dict) -> dict:
        merged = {
            name: attrs.get(name, getattr(self.instance, name, ""))
            for name in ("kind", "weights_path", "endpoint_url", "name")
        }
        kind = merged["kind"] or PolicyKind.LOCAL
        if kind == PolicyKind.LOCAL and not merged["weights_path"]:
            raise serializers.ValidationError({"weights_path": "A local policy needs a model directory."})
        if kind == PolicyKind.ENDPOINT and not merged["endpoint_url"]:
            raise serializers.ValidationError({"endpoint_url": "An endpoint policy needs the endpoint's base URL."})
        if self.instance is not None and attrs.get("parent") == self.instance:
            raise serializers.ValidationError({"parent": "A policy version cannot be its own parent."})
        project = self.context.get("project")
        if project is not None:
            candidate = PolicyVersion(
                project_id=project.pk,
                kind=kind,
                weights_path=merged["weights_path"],
                endpoint_url=merged["endpoint_url"],
            )
            errors = candidate.location_errors()
            if errors:
                raise serializers.ValidationError(errors)
        clash = in_project(self, PolicyVersion, name=merged["name"])
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError({"name": "Another policy version of this project has this name."})
        return attrs


# --- Trajectories -------------------------------------------------------------------------------------------------
