"""Celery tasks. Thin: they take a run's primary key, and `execute_run` re-fetches the row, claims it, runs one
pipeline and records the outcome. A run that already finished is left alone, so a redelivered message is harmless."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_init, worker_process_init
from django.conf import settings

from training.runs import execute_run


@worker_init.connect
@worker_process_init.connect
def _limit_torch_threads(**kwargs) -> None:
    if settings.TANDEM_TORCH_THREADS:
        import torch

        torch.set_num_threads(settings.TANDEM_TORCH_THREADS)


@shared_task(name="training.rollout", acks_late=True)
def rollout(run_id: int) -> str | None:
    from training.rollouts import run_rollout

    return execute_run(run_id, run_rollout)


@shared_task(name="training.train_bootstrap_policy", acks_late=True)
def bootstrap_policy(run_id: int) -> str | None:
    from training.bootstrap import run_bootstrap

    return execute_run(run_id, run_bootstrap)


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
