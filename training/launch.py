"""What the web side asks of the training side, in one place: create a run of any kind (its checks raise
`LaunchError` naming each field), send it or an intervention's continuation to the workers, cancel it, run a rollout
or a bootstrap in this process (the demo's set-up), and the run kinds' settings the launch forms are built from.

`feedback_app` imports `training` through this module only; `training` reads and writes `feedback_app`'s models.
The Celery app is imported when something is sent, not when a web process starts.
"""

from __future__ import annotations

from feedback_app.models import RunStatus, TrainingRun
from training.bootstrap import bootstrap_in_process
from training.judges import JUDGE_RUN_KINDS, PIPELINES, create_judge_run
from training.judges import MANAGED_SETTINGS as JUDGE_MANAGED_SETTINGS
from training.launch_checks import LaunchError
from training.policy_runs import MANAGED_SETTINGS as POLICY_MANAGED_SETTINGS
from training.policy_runs import POLICY_RUN_KINDS, TRAINERS, create_policy_run
from training.rollouts import RolloutConfig, create_rollout_run, run_rollout
from training.runs import execute_run, request_cancel

__all__ = [
    "JUDGE_MANAGED_SETTINGS",
    "JUDGE_RUN_KINDS",
    "PIPELINES",
    "POLICY_MANAGED_SETTINGS",
    "POLICY_RUN_KINDS",
    "TRAINERS",
    "LaunchError",
    "RolloutConfig",
    "bootstrap_in_process",
    "create_judge_run",
    "create_policy_run",
    "create_rollout_run",
    "request_cancel",
    "roll_out_here",
    "send",
    "send_continuation",
]


def send(run: TrainingRun) -> None:
    """Queue `run` on its kind's worker task once the current transaction commits (at once outside one)."""
    from training.tasks import TASK_FOR_KIND

    TASK_FOR_KIND[run.kind].delay_on_commit(run.pk)


def send_continuation(intervention_id: int) -> None:
    """Queue the policy's continuation after an intervention's corrected turn, once the transaction commits."""
    from training.tasks import continue_intervention

    continue_intervention.delay_on_commit(intervention_id)


def roll_out_here(run: TrainingRun) -> RunStatus | None:
    """Execute a queued rollout run in this process, as a worker would; its final status."""
    return execute_run(run.pk, run_rollout)
