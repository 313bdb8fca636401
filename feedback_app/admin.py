from __future__ import annotations

from django.contrib import admin

from feedback_app import models as m


class StepInline(admin.TabularInline):
    model = m.Step
    extra = 0
    fields = ("index", "observation", "reasoning", "action", "env_reward", "logprob", "done")


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
    inlines = [StepInline]


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
