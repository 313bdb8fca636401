from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class RunKind(models.TextChoices):
    ROLLOUT = "rollout", "Rollout"
    BOOTSTRAP = "bootstrap", "Policy bootstrap (SFT on scripted demos)"
    REWARD_MODEL = "reward_model", "Reward model"
    PRM = "prm", "Process reward model"
    VALUE_CRITIC = "value_critic", "Value critic"
    GENERATIVE_CRITIC = "generative_critic", "Generative critic"
    PREFERENCE_MODEL = "preference_model", "Preference model (pairwise)"
    DPO = "dpo", "DPO"
    KTO = "kto", "KTO"
    SFT = "sft", "SFT"
    PPO = "ppo", "PPO"
    NASH_MD = "nash_md", "Nash-MD"
    SPO = "spo", "SPO (self-play win rates)"
    GRPO = "grpo", "GRPO"
    EVALUATION = "evaluation", "Evaluation"


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
TRACEBACK_START = "Traceback (most recent call last):"


class DatasetSnapshot(models.Model):
    """A frozen, filtered export: the exact label rows and a hash of the bytes, so a run cites what it trained on."""

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="snapshots")
    name = models.CharField(max_length=200)
    export_kind = models.CharField(
        max_length=32, help_text="The export kind it froze, e.g. preference, stepwise or returns."
    )
    filters = models.JSONField(default=dict, blank=True)
    row_ids = models.JSONField(default=list, blank=True, help_text="Primary keys of the label rows it holds.")
    row_count = models.PositiveIntegerField(default=0)
    content_hash = models.CharField(max_length=64, help_text="SHA-256 of the exported bytes.")
    path = models.CharField(max_length=500, blank=True, help_text="Where the frozen file lies under ARTIFACT_ROOT.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="snapshot_unique_name_per_project"),
            models.CheckConstraint(condition=Q(content_hash__regex=r"^[0-9a-f]{64}$"), name="snapshot_hash_is_sha256"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.content_hash[:12]})"

    @property
    def file(self) -> Path:
        """The absolute path of the frozen file (a path for ``datasets.load_dataset``)."""
        return Path(settings.ARTIFACT_ROOT) / self.path

    def open(self) -> BinaryIO:
        """The frozen file, opened for binary reading (the caller closes it)."""
        return self.file.open("rb")

    def chunks(self, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]:
        with self.open() as stream:
            while chunk := stream.read(chunk_bytes):
                yield chunk

    def verify(self) -> bool:
        """Whether the file's bytes still hash to the recorded `content_hash`."""
        digest = hashlib.sha256()
        for chunk in self.chunks():
            digest.update(chunk)
        return digest.hexdigest() == self.content_hash


class TrainingRun(models.Model):
    """One unit of background work with a status, progress, a metrics series, a log and an artifact directory.

    Rollouts, training and evaluation all go through this row, so the dashboard and the API watch every kind of
    run the same way. Only the worker executing the run writes its progress.
    """

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="runs")
    kind = models.CharField(max_length=24, choices=RunKind.choices)
    status = models.CharField(max_length=12, choices=RunStatus.choices, default=RunStatus.QUEUED)
    config = models.JSONField(default=dict, blank=True)
    snapshot = models.ForeignKey(DatasetSnapshot, null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    base_policy = models.ForeignKey(
        "feedback_app.PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    inputs = models.JSONField(default=dict, blank=True, help_text="Other inputs, e.g. judge models by run id.")
    progress_current = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    progress_phase = models.CharField(
        max_length=200,
        blank=True,
        help_text="What the progress counts besides training (evaluating a policy, rolling out); empty: training.",
    )
    phase_started_at = models.DateTimeField(null=True, blank=True, help_text="When the current phase began.")
    metrics = models.JSONField(default=list, blank=True, help_text="A series of {step, name: value, ...} points.")
    summary = models.JSONField(default=dict, blank=True, help_text="Final figures of the run.")
    log = models.TextField(blank=True)
    artifact_dir = models.CharField(max_length=500, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(
        max_length=255, blank=True, help_text="host:pid of the process executing the run, while it runs."
    )
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="When the executing process last reported; a stale one is presumed dead."
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=RunKind.values), name="run_valid_kind"),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_valid_status"),
            models.CheckConstraint(
                condition=Q(progress_current__lte=F("progress_total")) | Q(progress_total=0),
                name="run_progress_within_total",
            ),
        ]
        indexes = [models.Index(fields=["project", "kind", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} run {self.pk}"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def progress_fraction(self) -> float:
        return self.progress_current / self.progress_total if self.progress_total else 0.0

    @property
    def error_reason(self) -> str:
        """Why the run failed, in the words a person reads first: the error's first paragraph (a run that failed
        before it was kept that way: its traceback's last line)."""
        if not self.error.startswith(TRACEBACK_START):
            return self.error.split("\n\n", 1)[0]
        return self.error.rstrip().rsplit("\n", 1)[-1]

    @property
    def error_traceback(self) -> str:
        return self.error[self.error.find(TRACEBACK_START) :] if TRACEBACK_START in self.error else ""

    @property
    def eta(self) -> timedelta | None:
        """The time left in the current phase (training, an evaluation, rollouts), at the pace of the phase so far."""
        started = self.phase_started_at or self.started_at
        if self.status != RunStatus.RUNNING or not started or not self.progress_current:
            return None
        elapsed = timezone.now() - started
        return elapsed * (self.progress_total - self.progress_current) / self.progress_current


class JudgeKind(models.TextChoices):
    REWARD_MODEL = "reward_model", "Reward model"
    PRM = "prm", "Process reward model"
    VALUE_CRITIC = "value_critic", "Value critic"
    GENERATIVE_CRITIC = "generative_critic", "Generative critic"
    PREFERENCE_MODEL = "preference_model", "Preference model (pairwise)"


class RegisteredModel(models.Model):
    """The model registry's entry for a judge model (policies are `PolicyVersion`s): where its directory lies and
    its lineage, i.e. which run made it from which snapshot of labels on which base model."""

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="registered_models")
    name = models.CharField(max_length=120)
    kind = models.CharField(max_length=24, choices=JudgeKind.choices)
    path = models.CharField(max_length=500, help_text="The model directory (Hugging Face layout plus manifest).")
    run = models.OneToOneField(TrainingRun, on_delete=models.PROTECT, related_name="registered_model")
    snapshot = models.ForeignKey(
        DatasetSnapshot, null=True, blank=True, on_delete=models.PROTECT, related_name="registered_models"
    )
    snapshot_hash = models.CharField(max_length=64, blank=True, help_text="The hash of the data it learned from.")
    base_policy = models.ForeignKey(
        "feedback_app.PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="judge_models"
    )
    base_model = models.CharField(max_length=500, help_text="The directory it was fine-tuned from.")
    inputs = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="used_by", help_text="Judge models it learned from."
    )
    metrics = models.JSONField(default=dict, blank=True, help_text="Held-out evaluation figures.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="registered_model_unique_name"),
            models.CheckConstraint(condition=Q(kind__in=JudgeKind.values), name="registered_model_valid_kind"),
        ]
        indexes = [models.Index(fields=["project", "kind", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.name}"


class Evaluation(models.Model):
    """Figures for one policy version (or judge model run) on one split with one decoding setting."""

    project = models.ForeignKey("feedback_app.Project", on_delete=models.CASCADE, related_name="evaluations")
    policy_version = models.ForeignKey(
        "feedback_app.PolicyVersion", null=True, blank=True, on_delete=models.CASCADE, related_name="evaluations"
    )
    run = models.ForeignKey(TrainingRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="evaluations")
    name = models.CharField(max_length=64, help_text="e.g. heldout_success, human_win_rate, rm_score")
    decoding = models.CharField(max_length=16, blank=True, help_text="greedy or sampled, where it applies.")
    value = models.FloatField()
    stderr = models.FloatField(null=True, blank=True)
    n = models.PositiveIntegerField(default=0, help_text="How many episodes or judgements the figure rests on.")
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(policy_version__isnull=False) | Q(run__isnull=False), name="evaluation_has_subject"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}={self.value:.3f}"
