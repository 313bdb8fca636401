"""Rollout runs: a policy version plays N tasks × K samples, batched across episodes, and the trajectories land in
the database in one transaction. A review rollout of a new version then goes back to the annotators: comparisons
against its parent on the same review tasks, and its mean reward-model score beside the parent's."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from django.db import transaction

from feedback_app.models import (
    Evaluation,
    JudgeKind,
    PolicyVersion,
    Project,
    QueueItem,
    RegisteredModel,
    RunKind,
    Step,
    Task,
    TrainingRun,
    Trajectory,
)
from feedback_app.models.projects import QueryStrategy
from feedback_app.models.trajectories import TaskSplit, TrajectorySource
from reward_models.envs import load_environment
from reward_models.rollout import Episode, rollout
from training.policies import policy_for
from training.runs import RunRecorder
from training.selection import (
    NEEDS_REWARD_MODEL,
    SelectionOptions,
    member_rewards,
    newest_reward_model,
    queue_selection,
    queue_step_reviews,
)


@dataclass
class RolloutConfig:
    task_ids: list[int] = field(default_factory=list, metadata={"help": "Tasks to play; empty takes `split`."})
    split: str = field(default=TaskSplit.REVIEW, metadata={"help": "Which tasks when task_ids is empty."})
    num_tasks: int = field(default=16, metadata={"help": "How many tasks of `split`, lowest ids first."})
    samples_per_task: int = field(default=2, metadata={"help": "Episodes per task (K)."})
    greedy: bool = field(default=False, metadata={"help": "Greedy decoding instead of sampling."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    seed: int = field(default=0, metadata={"help": "Sampling seed: the same seed gives the same episodes."})
    max_turns: int = field(default=100, metadata={"help": "Hard stop per episode beyond the environment's own."})
    compare_with_parent: bool = field(
        default=False,
        metadata={
            "help": "Queue blind comparisons of every new trajectory against one of the parent version's on the same "
            "task (rolling the parent out where it has none), and score both with the project's newest reward model."
        },
    )
    review_priority: int = field(default=10, metadata={"help": "Queue priority of those comparisons."})
    queue_comparisons: int = field(
        default=0,
        metadata={
            "help": "After storing, queue this many comparisons among the run's trajectories (pairs of one task), "
            "chosen by the project's query strategy (training.selection)."
        },
    )
    queue_step_labels: int = field(
        default=0,
        metadata={
            "help": "After storing, queue this many of the run's trajectories for step labels: the ones the reward "
            "model scores lowest under a reward-model strategy, else a random sample."
        },
    )

    def __post_init__(self) -> None:
        if self.split not in TaskSplit.values:
            raise ValueError(f"split must be one of {TaskSplit.values}, got {self.split!r}")
        if not isinstance(self.task_ids, list) or not all(isinstance(i, int) for i in self.task_ids):
            raise ValueError("task_ids must be a list of task ids")
        for name in ("num_tasks", "samples_per_task", "max_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not isinstance(self.compare_with_parent, bool):
            raise ValueError(f"compare_with_parent must be true or false, got {self.compare_with_parent!r}")
        for name in ("queue_comparisons", "queue_step_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a whole number of at least 0, got {value!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RolloutConfig:
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown rollout settings: {sorted(unknown)}")
        return cls(**values)


def create_rollout_run(
    project: Project, policy: PolicyVersion, config: RolloutConfig, *, created_by=None
) -> TrainingRun:
    """Record a rollout run; enqueue it with `training.tasks.rollout.delay_on_commit(run.pk)`."""
    if policy.project_id != project.pk:
        raise ValueError("policy: the policy version belongs to another project")
    policy.policy_spec()  # raises for an external policy, which Tandem cannot run
    return TrainingRun.objects.create(
        project=project, kind=RunKind.ROLLOUT, base_policy=policy, config=asdict(config), created_by=created_by
    )


def run_rollout(run: TrainingRun, recorder: RunRecorder) -> dict[str, Any]:
    config = RolloutConfig.from_dict(run.config)
    tasks = _tasks_for(run.project, config)
    expected = len(tasks) * config.samples_per_task
    stored = Trajectory.objects.filter(rollout_run=run, policy_version=run.base_policy).count()
    if stored == expected:
        # An earlier attempt stored everything, then died before marking the run done.
        recorder.log(f"all {stored} trajectories already stored")
    else:
        recorder.log(f"rolling out {run.base_policy.name} on {len(tasks)} tasks × {config.samples_per_task} samples")
        roll_out(run, run.base_policy, tasks, config, recorder)
    summary = _summary(run)
    recorder.log(f"stored {summary['trajectories']} trajectories, success rate {summary['success_rate']:.2f}")
    if config.compare_with_parent:
        summary["review"] = send_to_review(run, tasks, config, recorder)
    if config.queue_comparisons or config.queue_step_labels:
        summary["queued"] = queue_for_labels(run, config, recorder)
    return summary


def queue_for_labels(run: TrainingRun, config: RolloutConfig, recorder: RunRecorder) -> dict[str, Any]:
    """Queue `queue_comparisons` pairs among the run's own trajectories by the project's query strategy, and
    `queue_step_labels` of them for step labels. Runs once per run: the items and the record of them in
    `run.inputs["queued"]` are written together, so an attempt taken up again finds the record and queues nothing.

    The reward model scores the trajectories before the transaction: on SQLite a transaction holds the database's
    one write lock from its start, and a page that writes (a label, or an API token's last use) waits at most the
    connection's timeout for it."""
    trajectories = list(Trajectory.objects.filter(rollout_run=run, policy_version=run.base_policy).order_by("id"))
    strategy = run.project.query_strategy
    scores = None
    if strategy in NEEDS_REWARD_MODEL and (scorer := newest_reward_model(run.project)) is not None:
        scores = member_rewards([t for t in trajectories if t.num_steps], scorer)
    with transaction.atomic():
        locked = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if "queued" in locked.inputs:
            recorder.log("this run's labelling items were queued by an earlier attempt")
            return locked.inputs["queued"]
        options = SelectionOptions(rng=random.Random(config.seed), log=recorder.log, scores=scores)
        pairs = queue_selection(run.project, trajectories, config.queue_comparisons, options)
        steps = queue_step_reviews(run.project, trajectories, config.queue_step_labels, options)
        queued = {
            "project_strategy": strategy,
            "comparisons": len(pairs.items),
            "comparisons_by_strategy": pairs.by_strategy(),
            "step_labels": len(steps.items),
            "step_labels_by_strategy": steps.by_strategy(),
            "notes": pairs.notes + steps.notes,
        }
        TrainingRun.objects.filter(pk=run.pk).update(inputs={**locked.inputs, "queued": queued})
    recorder.log(
        f"queued {queued['comparisons']} comparisons {queued['comparisons_by_strategy']} and "
        f"{queued['step_labels']} step-label items {queued['step_labels_by_strategy']}"
    )
    return queued


def roll_out(
    run: TrainingRun,
    policy: PolicyVersion,
    tasks: list[Task],
    config: RolloutConfig,
    recorder: RunRecorder,
    *,
    sample_offset: int = 0,
) -> list[Trajectory]:
    """Play `policy` on `tasks` with `config`'s decoding and store the episodes under `run`, numbering each task's
    samples from `sample_offset` (a run's trajectories of one task must have distinct sample numbers)."""
    env_spec = run.project.environment
    episodes = rollout(
        partial(load_environment, env_spec.dotted_path, env_spec.config),
        [task.spec or {"seed": task.seed, "instruction": task.instruction} for task in tasks],
        policy_for(policy),
        samples_per_task=config.samples_per_task,
        greedy=config.greedy,
        temperature=config.temperature,
        seed=config.seed,
        max_turns=config.max_turns,
        progress=lambda done, total: recorder.progress(done, total),
    )
    task_of = [task for task in tasks for _ in range(config.samples_per_task)]
    generation = {"greedy": config.greedy, "temperature": config.temperature}
    return store_episodes(run, task_of, episodes, generation=generation, policy=policy, sample_offset=sample_offset)


def _tasks_for(project: Project, config: RolloutConfig) -> list[Task]:
    if config.task_ids:
        tasks = list(Task.objects.filter(project=project, pk__in=config.task_ids).order_by("id"))
        missing = set(config.task_ids) - {task.pk for task in tasks}
        if missing:
            raise ValueError(f"task_ids: no tasks {sorted(missing)} in project {project.slug}")
    else:
        tasks = list(Task.objects.filter(project=project, split=config.split).order_by("id")[: config.num_tasks])
    if not tasks:
        raise ValueError(f"split: project {project.slug} has no {config.split} tasks to roll out")
    return tasks


def store_episodes(
    run: TrainingRun,
    tasks: list[Task],
    episodes: list[Episode],
    *,
    generation: dict[str, Any],
    policy: PolicyVersion | None = None,
    sample_offset: int = 0,
) -> list[Trajectory]:
    """Insert trajectories and their steps in one transaction: a rollout lands whole or not at all. They are the
    run's policy's unless `policy` names another (a review rollout also plays the parent where it must)."""
    sample_counter: dict[int, int] = {}
    trajectories = []
    for task, episode in zip(tasks, episodes, strict=True):
        trajectories.append(
            trajectory_for_episode(
                episode,
                project_id=run.project_id,
                task=task,
                policy_version_id=policy.pk if policy else run.base_policy_id,
                rollout_run=run,
                sample_index=sample_counter.setdefault(task.pk, sample_offset),
                metadata=generation,
            )
        )
        sample_counter[task.pk] += 1
    save_trajectories(trajectories, episodes)
    return trajectories


def trajectory_for_episode(
    episode: Episode, *, project_id: int, task: Task, metadata: dict[str, Any] | None = None, **fields: Any
) -> Trajectory:
    """An unsaved Trajectory of `episode`, with its outcome and the oracle's hidden facts (source "policy" unless
    `fields` say otherwise)."""
    oracle = asdict(episode.oracle) if episode.oracle else {}
    fields.setdefault("source", "policy")
    return Trajectory(
        project_id=project_id,
        task=task,
        num_steps=episode.length,
        total_env_reward=episode.total_reward,
        success=episode.success,
        outcome_return=oracle.get("true_return", episode.total_reward),
        oracle=oracle,
        metadata={**(metadata or {}), "truncated": episode.truncated, "final_observation": episode.final_observation},
        prompt=episode.prompt,
        tools=episode.tools,
        **fields,
    )


def save_trajectories(trajectories: list[Trajectory], episodes: list[Episode]) -> None:
    """Insert `trajectories` (from `trajectory_for_episode`) and their episodes' steps in one transaction."""
    with transaction.atomic():
        Trajectory.objects.bulk_create(trajectories, batch_size=500)
        Step.objects.bulk_create(
            (
                Step(
                    trajectory=trajectory,
                    index=index,
                    message=step.message,
                    replies=step.replies,
                    token_ids=step.token_ids,
                    observation=step.observation,
                    reasoning=step.reasoning,
                    action=step.action,
                    tool_calls=step.tool_calls,
                    env_reward=step.reward,
                    logprob=step.logprob,
                    render=step.render or {},
                    done=step.done,
                )
                for trajectory, episode in zip(trajectories, episodes, strict=True)
                for index, step in enumerate(episode.steps)
            ),
            batch_size=2000,
        )


def _summary(run: TrainingRun) -> dict[str, Any]:
    rows = list(
        Trajectory.objects.filter(rollout_run=run, policy_version=run.base_policy).values_list("success", "num_steps")
    )
    n = len(rows)
    return {
        "trajectories": n,
        "success_rate": sum(bool(success) for success, _ in rows) / n if n else 0.0,
        "mean_length": sum(length for _, length in rows) / n if n else 0.0,
    }


# Review: a new version's rollout on the review tasks goes back to the annotators against its parent.


def send_to_review(
    run: TrainingRun, tasks: list[Task], config: RolloutConfig, recorder: RunRecorder
) -> dict[str, Any]:
    """After a review rollout of a version: make sure its parent has trajectories on the same tasks (rolling the
    parent out, under this run, where it has none), queue one comparison per new trajectory against a parent
    trajectory of its task, and record both versions' mean reward-model score. Safe to repeat."""
    version = run.base_policy
    parent = version.parent
    if parent is None:
        recorder.log(f"{version.name} has no parent version: nothing to compare against")
        return {"comparisons": 0}
    new = list(Trajectory.objects.filter(rollout_run=run, policy_version=version).order_by("task_id", "id"))
    theirs = _parent_trajectories(parent, tasks)
    missing = [task for task in tasks if not theirs[task.pk]]
    if missing:
        recorder.log(f"rolling out the parent {parent.name} on {len(missing)} review tasks it has not played")
        for trajectory in roll_out(run, parent, missing, config, recorder, sample_offset=config.samples_per_task):
            theirs[trajectory.task_id].append(trajectory)
    pairs = []
    for index, trajectory in enumerate(new):
        candidates = theirs[trajectory.task_id]
        pairs.append((trajectory, candidates[index % len(candidates)]))
    queued = QueueItem.objects.enqueue_comparisons(
        run.project, pairs, priority=config.review_priority, query_strategy=QueryStrategy.NEW_VS_PARENT
    )
    recorder.log(f"queued {len(queued)} comparisons of {version.name} against {parent.name} for review")
    scores = record_reward_model_scores(run, version, parent, new, [t for ts in theirs.values() for t in ts], recorder)
    return {"comparisons": len(queued), "pairs": len(pairs), **scores}


def _parent_trajectories(parent: PolicyVersion, tasks: list[Task]) -> dict[int, list[Trajectory]]:
    """The parent's own rollouts on `tasks` (not interventions' branches), by task."""
    found: dict[int, list[Trajectory]] = {task.pk: [] for task in tasks}
    rows = Trajectory.objects.filter(
        policy_version=parent, task__in=tasks, source=TrajectorySource.POLICY, parent__isnull=True
    ).order_by("task_id", "id")
    for trajectory in rows:
        found[trajectory.task_id].append(trajectory)
    return found


def record_reward_model_scores(
    run: TrainingRun,
    version: PolicyVersion,
    parent: PolicyVersion,
    new: list[Trajectory],
    old: list[Trajectory],
    recorder: RunRecorder,
) -> dict[str, float]:
    """Score both versions' review trajectories with the project's newest reward model and store each mean as an
    `rm_score` evaluation. Without a reward model there is nothing to record."""
    from reward_models.reward.model import load_reward_model

    judge = (
        RegisteredModel.objects.filter(project=run.project, kind=JudgeKind.REWARD_MODEL)
        .order_by("-created_at", "-id")
        .first()
    )
    if judge is None or not new or not old:
        return {}
    model = load_reward_model(judge.path)
    conversations = Trajectory.objects.conversations([t.pk for t in [*new, *old]])
    figures: dict[str, float] = {}
    evaluations = []
    for policy, trajectories in ((version, new), (parent, old)):
        messages = [conversations[t.pk] for t in trajectories]
        rewards, _ = model.score([m[:2] for m in messages], [m[2:] for m in messages])
        mean = sum(rewards) / len(rewards)
        spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(len(rewards) - 1, 1))
        evaluations.append(
            Evaluation(
                project=run.project,
                policy_version=policy,
                run=run,
                name="rm_score",
                value=mean,
                stderr=spread / math.sqrt(len(rewards)),
                n=len(rewards),
                details={"reward_model": judge.pk, "tasks": sorted({t.task_id for t in trajectories})},
            )
        )
        figures["rm_score_new" if policy == version else "rm_score_parent"] = mean
    with transaction.atomic():
        Evaluation.objects.filter(run=run, name="rm_score").delete()
        Evaluation.objects.bulk_create(evaluations)
    recorder.log(
        f"reward model {judge.name}: {version.name} {figures['rm_score_new']:.3f}, "
        f"{parent.name} {figures['rm_score_parent']:.3f}"
    )
    return figures
