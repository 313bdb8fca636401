"""Celery tasks. Thin: they take a run's primary key, and `execute_run` re-fetches the row, claims it, runs one
pipeline and records the outcome. A run that already finished is left alone, so a redelivered message is harmless."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_init, worker_process_init, worker_ready
from django.conf import settings

from feedback_app.models import RunKind
from training.runs import RunBusy, RunRecorder, execute_run, orphaned_runs

logger = logging.getLogger(__name__)


@worker_init.connect
@worker_process_init.connect
def _limit_torch_threads(**kwargs) -> None:
    if settings.TANDEM_TORCH_THREADS:
        import torch

        torch.set_num_threads(settings.TANDEM_TORCH_THREADS)


def _execute(task, run_id: int, body, recorder_factory=None) -> str | None:
    """Execute a run; if another live process is executing it (a duplicate delivery), come back when its owner
    would be presumed dead, so a run whose worker vanished is still finished."""
    try:
        return execute_run(run_id, body, recorder_factory)
    except RunBusy as busy:
        raise task.retry(exc=busy, countdown=settings.TANDEM_RUN_STALE_SECONDS, max_retries=None) from None


@shared_task(bind=True, name="training.rollout", acks_late=True)
def rollout(self, run_id: int) -> str | None:
    from training.rollouts import run_rollout

    return _execute(self, run_id, run_rollout)


@shared_task(bind=True, name="training.train_bootstrap_policy", acks_late=True)
def bootstrap_policy(self, run_id: int) -> str | None:
    from training.bootstrap import run_bootstrap

    return _execute(self, run_id, run_bootstrap)


@shared_task(bind=True, name="training.train_judge", acks_late=True)
def train_judge(self, run_id: int) -> str | None:
    """Reward model, PRM, value critic or generative critic (the `training` queue). The cancel flag is read at
    every optimiser step."""
    from training.judges import run_judge

    return _execute(self, run_id, run_judge, lambda pk: RunRecorder(pk, check_interval=0.0))


@shared_task(bind=True, name="training.train_policy", acks_late=True)
def train_policy(self, run_id: int) -> str | None:
    """DPO, KTO, SFT, PPO, Nash-MD, SPO or GRPO (the `training` queue): a new policy version, sent to review. The
    cancel flag is read at every optimiser step."""
    from training.policy_runs import run_policy_training

    def train_and_send_review(run, recorder: RunRecorder) -> dict:
        summary = run_policy_training(run, recorder)
        if summary.get("review_run") is not None:
            # A repeated send (a run taken up again) is harmless: a finished or running rollout is not run twice.
            rollout.delay_on_commit(summary["review_run"])
        return summary

    return _execute(self, run_id, train_and_send_review, lambda pk: RunRecorder(pk, check_interval=0.0))


@shared_task(
    name="training.continue_intervention",
    acks_late=True,
    autoretry_for=(ConnectionError,),
    retry_backoff=True,
    max_retries=3,
)
def continue_intervention(intervention_id: int) -> int | None:
    """Continue an annotator's intervention with the current policy (the `rollouts` queue); see
    training.interventions. Only an unreachable policy endpoint is retried."""
    from training.interventions import continue_intervention as make_child

    return make_child(intervention_id)


# The task that executes each kind of run, for taking orphaned runs up again.
TASK_FOR_KIND = {
    RunKind.ROLLOUT: rollout,
    RunKind.BOOTSTRAP: bootstrap_policy,
    RunKind.REWARD_MODEL: train_judge,
    RunKind.PRM: train_judge,
    RunKind.VALUE_CRITIC: train_judge,
    RunKind.GENERATIVE_CRITIC: train_judge,
    RunKind.PREFERENCE_MODEL: train_judge,
    **dict.fromkeys(
        (RunKind.DPO, RunKind.KTO, RunKind.SFT, RunKind.PPO, RunKind.NASH_MD, RunKind.SPO, RunKind.GRPO), train_policy
    ),
}


@worker_ready.connect
def requeue_orphaned_runs(**kwargs) -> None:
    """When a worker starts, send again every run whose executing process died (a killed worker), so it resumes
    from its checkpoints. A second message for a run that is finished or owned by a live process does no harm."""
    for run in orphaned_runs():
        task = TASK_FOR_KIND.get(run.kind)
        if task is not None:
            logger.warning("run %s was left running by %s, which is gone; sending it again", run.pk, run.worker)
            task.delay(run.pk)
