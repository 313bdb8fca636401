"""The nouns of Tandem (see shared/DESIGN.md), split by feature."""

from feedback_app.models.labels import (
    Comparison,
    Critique,
    Intervention,
    LabelKind,
    Rating,
    StepLabel,
)
from feedback_app.models.projects import EnvironmentSpec, FeedbackKind, Membership, Project, Role
from feedback_app.models.queue import Assignment, QueueItem
from feedback_app.models.runs import (
    DatasetSnapshot,
    Evaluation,
    JudgeKind,
    RegisteredModel,
    RunKind,
    RunStatus,
    TrainingRun,
)
from feedback_app.models.tokens import ApiToken
from feedback_app.models.trajectories import PolicyVersion, Step, Task, Trajectory

__all__ = [
    "ApiToken",
    "Assignment",
    "Comparison",
    "Critique",
    "DatasetSnapshot",
    "EnvironmentSpec",
    "Evaluation",
    "FeedbackKind",
    "Intervention",
    "JudgeKind",
    "LabelKind",
    "Membership",
    "PolicyVersion",
    "Project",
    "QueueItem",
    "Rating",
    "RegisteredModel",
    "Role",
    "RunKind",
    "RunStatus",
    "Step",
    "StepLabel",
    "Task",
    "TrainingRun",
    "Trajectory",
]
