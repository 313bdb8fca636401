from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from feedback_app import models as m


class MembershipInline(admin.TabularInline):
    model = m.Membership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(m.EnvironmentSpec)
class EnvironmentSpecAdmin(admin.ModelAdmin):
    list_display = ("name", "dotted_path", "created_at")
    search_fields = ("name", "dotted_path")


@admin.register(m.Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "environment", "overlap", "blind", "query_strategy", "created_at")
    list_filter = ("query_strategy",)
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]


@admin.register(m.Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "project", "role")
    list_filter = ("role", "project")


@admin.register(m.Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "seed", "split", "external_id", "instruction")
    list_filter = ("project", "split")
    search_fields = ("external_id", "instruction")


@admin.register(m.PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "kind", "parent", "produced_by", "created_at")
    list_filter = ("project", "kind")
    raw_id_fields = ("parent", "produced_by")


@admin.register(m.Trajectory)
class TrajectoryAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "task", "policy_version", "source", "num_steps", "success", "created_at")
    list_filter = ("project", "source", "policy_version", "success")
    search_fields = ("external_id",)
    raw_id_fields = ("task", "parent", "rollout_run", "policy_version")
    # Steps are not inlined: a trajectory may have thousands, and a page of every one of them took minutes. They are
    # listed a page at a time in the steps' own list.
    readonly_fields = ("steps",)

    @admin.display(description="Steps")
    def steps(self, trajectory: m.Trajectory) -> str:
        if trajectory.pk is None:
            return "—"
        listing = reverse("admin:feedback_app_step_changelist") + f"?trajectory__id__exact={trajectory.pk}"
        page = reverse("trajectory-detail", args=[trajectory.project_id, trajectory.pk])
        return format_html(
            '{} steps: <a href="{}">list them, a page at a time</a> · <a href="{}">the trajectory page</a>',
            trajectory.num_steps,
            listing,
            page,
        )


@admin.register(m.Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("index", "trajectory", "action", "env_reward", "done")
    list_select_related = ("trajectory",)
    ordering = ("trajectory", "index")
    raw_id_fields = ("trajectory",)
    show_full_result_count = False  # a count of every step in the database on each page is slow

    def lookup_allowed(self, lookup: str, value: str, request=None) -> bool:
        # The trajectory page's link lists one trajectory's steps; no filter in the sidebar offers that.
        return lookup == "trajectory__id__exact" or super().lookup_allowed(lookup, value, request)


class LabelAdmin(admin.ModelAdmin):
    """Labels are append-only: the admin shows them but never edits or deletes one."""

    list_filter = ("project", "is_current")
    readonly_fields = ("revision", "supersedes", "is_current", "client_token", "created_at")

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(m.Comparison)
class ComparisonAdmin(LabelAdmin):
    list_display = ("id", "annotator", "trajectory_a", "trajectory_b", "choice", "strength", "revision", "is_current")


@admin.register(m.StepLabel)
class StepLabelAdmin(LabelAdmin):
    list_display = ("id", "annotator", "step", "value", "revision", "is_current")


@admin.register(m.Critique)
class CritiqueAdmin(LabelAdmin):
    list_display = ("id", "annotator", "trajectory", "step", "span_field", "span_start", "span_end", "is_current")


@admin.register(m.Rating)
class RatingAdmin(LabelAdmin):
    list_display = ("id", "annotator", "trajectory", "score", "thumb_up", "is_current")


@admin.register(m.Intervention)
class InterventionAdmin(LabelAdmin):
    list_display = ("id", "annotator", "step", "original_action", "corrected_action", "status", "child_trajectory")


@admin.register(m.QueueItem)
class QueueItemAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "kind", "priority", "overlap", "completed_count", "is_gold")
    list_filter = ("project", "kind", "is_gold")
    raw_id_fields = ("trajectory", "other_trajectory")


@admin.register(m.Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ("id", "item", "annotator", "slot", "status", "leased_until")
    list_filter = ("status",)
    raw_id_fields = ("item",)


@admin.register(m.DatasetSnapshot)
class DatasetSnapshotAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "export_kind", "row_count", "content_hash", "created_at")
    readonly_fields = ("row_ids", "content_hash")


@admin.register(m.TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "kind", "status", "progress_current", "progress_total", "created_at")
    list_filter = ("project", "kind", "status")
    readonly_fields = (
        "metrics",
        "log",
        "error",
        "started_at",
        "finished_at",
        "attempts",
        "celery_task_id",
        "worker",
        "heartbeat_at",
    )


@admin.register(m.RegisteredModel)
class RegisteredModelAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "kind", "run", "snapshot", "created_at")
    list_filter = ("project", "kind")
    readonly_fields = ("path", "run", "snapshot", "snapshot_hash", "base_model", "metrics")


@admin.register(m.Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "policy_version", "decoding", "value", "stderr", "n", "created_at")
    list_filter = ("project", "name", "decoding")


@admin.register(m.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "read_only", "created_at", "last_used_at", "revoked_at")
    list_filter = ("read_only",)
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
