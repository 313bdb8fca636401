"""Continuing an intervention: the policy plays on from the annotator's corrected prefix, making a child trajectory.

The prefix is the original trajectory's steps before the intervened one, then the corrected action (with the
annotator's reasoning, if any), then any takeover actions played by hand. It is replayed in the environment and
checked (the annotator's actions must be legal at their turn), then "the current policy" continues greedily to the
end of the episode: the trajectory's own policy version when Tandem can run it, else the project's newest runnable
version. The child lands with its steps in one transaction, as a branch of the original at the intervened step.

The Intervention row records the progress: pending → running → done (with `child_trajectory`) or failed (with
`error`). A redelivered message for a done intervention does nothing, and a child stored by an attempt that died
before marking the row done is found and reused, so a continuation never makes two children.
"""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction

from feedback_app.models import Intervention, PolicyVersion, Trajectory
from feedback_app.models.labels import InterventionStatus
from feedback_app.models.trajectories import NotReplayable, PolicyKind, TrajectorySource
from reward_models.envs import load_environment
from reward_models.envs.corrections import CorrectionError, replay_correction, turn_message
from reward_models.rollout import continue_episode
from training.policies import policy_for
from training.rollouts import save_trajectories, trajectory_for_episode

logger = logging.getLogger(__name__)

# Worth another attempt: an endpoint that did not answer (EndpointUnavailable is a ConnectionError). The task
# retries these; anything else fails the intervention for good.
TRANSIENT_ERRORS = (ConnectionError,)
# A guard against an environment that never ends an episode, as in rollout runs.
MAX_POLICY_TURNS = 100


class InterventionError(Exception):
    """A continuation that cannot be made, with a message for the annotator."""


def continue_intervention(intervention_id: int) -> int | None:
    """Make the child trajectory of intervention `intervention_id`; returns its id, or None if there is none.

    Failures are recorded on the row (status failed, `error`); transient ones are re-raised afterwards so the task
    can retry them.
    """
    with transaction.atomic():
        intervention = Intervention.objects.select_for_update().filter(pk=intervention_id).first()
        if intervention is None:
            logger.warning("intervention %s does not exist; dropping the message", intervention_id)
            return None
        if intervention.status == InterventionStatus.DONE:
            logger.info("intervention %s is already done; nothing to do", intervention_id)
            return intervention.child_trajectory_id
        child = _stored_child(intervention)
        if child is not None:
            _mark_done(intervention, child)
            return child.pk
        if not intervention.is_current:
            # The annotator has since revised the correction; the newer revision is continued instead.
            intervention.status = InterventionStatus.FAILED
            intervention.error = "Superseded by a later revision of this intervention, which is continued instead."
            intervention.save(update_fields=["status", "error"])
            return None
        intervention.status = InterventionStatus.RUNNING
        intervention.error = ""
        intervention.save(update_fields=["status", "error"])
    try:
        return _continue(intervention_id)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded on the row; transient ones go on to retry.
        if isinstance(exc, InterventionError):
            message = str(exc)
        else:
            logger.exception("intervention %s failed", intervention_id)
            message = f"{type(exc).__name__}: {exc}"
        intervention = Intervention.objects.get(pk=intervention_id)
        intervention.status = InterventionStatus.FAILED
        intervention.error = message
        intervention.save(update_fields=["status", "error"])
        if isinstance(exc, TRANSIENT_ERRORS):
            raise
        return None


def continuing_policy(trajectory: Trajectory) -> PolicyVersion | None:
    """The policy that continues a branch of `trajectory`: its own version when Tandem can run it (a local model or
    an endpoint), else the project's newest runnable version; None when the project has none."""
    own = trajectory.policy_version
    if own is not None and own.kind != PolicyKind.EXTERNAL:
        return own
    return (
        PolicyVersion.objects.filter(project_id=trajectory.project_id)
        .exclude(kind=PolicyKind.EXTERNAL)
        .order_by("-created_at", "-id")
        .first()
    )


def _continue(intervention_id: int) -> int:
    intervention = Intervention.objects.select_related(
        "step", "trajectory__task", "trajectory__policy_version", "project__environment"
    ).get(pk=intervention_id)
    trajectory = intervention.trajectory
    branch = intervention.step.index
    original = list(trajectory.steps.filter(index__lt=branch).order_by("index"))
    if [step.index for step in original] != list(range(branch)):
        raise InterventionError(f"Trajectory {trajectory.pk} is missing steps before step {branch + 1}.")
    environment = intervention.project.environment
    make_env = partial(load_environment, environment.dotted_path, environment.config)
    env = make_env()
    # Every turn verbatim: the agent's own before the intervened step, then the annotator's.
    human = [intervention.corrected_message, *(turn_message(env, turn) for turn in intervention.takeover_actions)]
    prefix = [step.message for step in original] + human
    try:
        task = trajectory.task.reset_spec()
    except NotReplayable as exc:
        reasons = (f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())
        raise InterventionError("; ".join(reasons)) from exc
    try:
        results = replay_correction(env, task, prefix[:branch], human[0], human[1:], trajectory.tools or None)
    except CorrectionError as exc:
        raise InterventionError(str(exc)) from exc

    ended_by_hand = results[-1].done
    if ended_by_hand:
        # Nobody but the annotator plays: there is no policy turn to take, and none is needed.
        version, policy = None, _NoPolicyTurns()
    else:
        version = continuing_policy(trajectory)
        if version is None:
            raise InterventionError(
                f"No policy can continue this trajectory: its policy "
                f"{trajectory.policy_version.name if trajectory.policy_version else '(none)'} cannot be run by "
                f"Tandem, and project {intervention.project.slug} has no local or endpoint policy version."
            )
        policy = policy_for(version)
    episode = continue_episode(make_env, task, prefix, policy, greedy=True, max_turns=MAX_POLICY_TURNS)
    # The shared prefix is the parent's, generated by its policy: keep what it generated as stored.
    for step, stored in zip(episode.steps, original, strict=False):
        step.reasoning, step.logprob, step.token_ids = stored.reasoning, stored.logprob, stored.token_ids
        step.text = stored.message.get("content") or ""
    episode.steps[branch].reasoning = intervention.corrected_reasoning

    human_steps = list(range(branch, branch + len(human)))
    child = trajectory_for_episode(
        episode,
        project_id=trajectory.project_id,
        task=trajectory.task,
        policy_version=version,
        source=TrajectorySource.HUMAN if ended_by_hand else TrajectorySource.POLICY,
        parent=trajectory,
        branch_step_index=branch,
        metadata={"intervention": intervention.pk, "human_steps": human_steps, "greedy": True},
    )
    with transaction.atomic():
        intervention = Intervention.objects.select_for_update().get(pk=intervention_id)
        stored = _stored_child(intervention)
        if stored is not None:
            # Another delivery of the same message finished first: keep its child.
            _mark_done(intervention, stored)
            return stored.pk
        save_trajectories([child], [episode])
        _mark_done(intervention, child)
    return child.pk


class _NoPolicyTurns:
    """Stands in for a policy when the annotator's takeover ended the episode, so no policy turn comes."""

    history_window = 0

    def act(self, conversations, **kwargs):
        raise RuntimeError("the episode ended inside the takeover; no policy turn was expected")


def _stored_child(intervention: Intervention) -> Trajectory | None:
    if intervention.child_trajectory_id:
        return intervention.child_trajectory
    return (
        Trajectory.objects.filter(parent_id=intervention.trajectory_id, metadata__intervention=intervention.pk)
        .order_by("id")
        .first()
    )


def _mark_done(intervention: Intervention, child: Trajectory) -> None:
    intervention.child_trajectory = child
    intervention.status = InterventionStatus.DONE
    intervention.error = ""
    intervention.save(update_fields=["child_trajectory", "status", "error"])
