"""A new policy version goes back to the annotators: comparisons against its parent on the same review tasks, its
mean reward-model score beside the parent's, and the human win rate those comparisons give."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Count, Q

from feedback_app.exports.conversation import fetch_conversations
from feedback_app.models import Comparison, Evaluation, JudgeKind, PolicyVersion, RegisteredModel, Task, TrainingRun
from feedback_app.models.trajectories import Trajectory, TrajectorySource
from feedback_app.queue import REVIEW_STRATEGY, enqueue_comparisons
from training.runs import RunRecorder

if TYPE_CHECKING:
    from training.rollouts import RolloutConfig

# A 95 % interval.
Z = 1.959963984540054


def send_to_review(
    run: TrainingRun, tasks: list[Task], config: RolloutConfig, recorder: RunRecorder
) -> dict[str, Any]:
    """After a review rollout of a version: make sure its parent has trajectories on the same tasks (rolling the
    parent out, under this run, where it has none), queue one comparison per new trajectory against a parent
    trajectory of its task, and record both versions' mean reward-model score. Safe to repeat."""
    from training.rollouts import roll_out

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
    queued = enqueue_comparisons(run.project, pairs, priority=config.review_priority, query_strategy=REVIEW_STRATEGY)
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
    from reward_models.reward import load_reward_model

    judge = (
        RegisteredModel.objects.filter(project=run.project, kind=JudgeKind.REWARD_MODEL)
        .order_by("-created_at", "-id")
        .first()
    )
    if judge is None or not new or not old:
        return {}
    model = load_reward_model(judge.path)
    conversations = fetch_conversations([t.pk for t in [*new, *old]])
    figures: dict[str, float] = {}
    evaluations = []
    for policy, trajectories in ((version, new), (parent, old)):
        messages = [conversations[t.pk].messages for t in trajectories]
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


def human_win_rate(version: PolicyVersion) -> dict[str, Any] | None:
    """How often annotators preferred `version` over its parent (`win_rate_of_counts`), from every current comparison
    of one's trajectory against the other's, gold items included. None without a parent."""
    if version.parent_id is None:
        return None
    return human_win_rates([version])[version.pk]


def human_win_rates(versions: Iterable[PolicyVersion]) -> dict[int, dict[str, Any] | None]:
    """`human_win_rate` of each version, from one query for all of them."""
    versions = list(versions)
    wanted = {pk for version in versions for pk in (version.pk, version.parent_id) if pk is not None}
    counts = version_comparison_counts(versions[0].project_id, wanted, gold=True) if versions else []
    return {
        version.pk: None if version.parent_id is None else win_rate_of_counts(version.pk, version.parent_id, counts)
        for version in versions
    }


def version_comparison_counts(
    project_id: int, versions: Iterable[int] | None = None, *, gold: bool
) -> list[tuple[int, int, str, int]]:
    """(version of a, version of b, choice, count) over the current comparisons between trajectories of two policy
    versions (both among `versions`, when given), with or without the comparisons of gold items (chosen to be easy,
    they test the annotator more than the policy)."""
    comparisons = Comparison.objects.filter(
        project=project_id,
        is_current=True,
        trajectory_a__policy_version__isnull=False,
        trajectory_b__policy_version__isnull=False,
    )
    if not gold:
        comparisons = comparisons.filter(Q(assignment__isnull=True) | Q(assignment__item__is_gold=False))
    if versions is not None:
        versions = list(versions)
        comparisons = comparisons.filter(
            trajectory_a__policy_version__in=versions, trajectory_b__policy_version__in=versions
        )
    rows = (
        comparisons.order_by()
        .values_list("trajectory_a__policy_version", "trajectory_b__policy_version", "choice")
        .annotate(n=Count("pk"))
    )
    return list(rows)


def win_rate_of_counts(version: int, parent: int, counts: Iterable[tuple[int, int, str, int]]) -> dict[str, Any]:
    """The win rate of `version` against `parent` from `version_comparison_counts`: a tie or "both bad" counts half,
    and the interval is Wilson's at 95 %."""
    tally: dict[str, int] = defaultdict(int)
    for version_a, version_b, choice, n in counts:
        if {version_a, version_b} != {version, parent}:
            continue  # another pair of versions, or two trajectories of the same version
        if choice in ("a", "b"):
            winner = version_a if choice == "a" else version_b
            tally["wins" if winner == version else "losses"] += n
        else:
            tally["ties"] += n
    n = tally["wins"] + tally["losses"] + tally["ties"]
    result: dict[str, Any] = {"parent": parent, "n": n, **{k: tally[k] for k in ("wins", "losses", "ties")}}
    if n == 0:
        return {**result, "value": None, "low": None, "high": None}
    rate = (tally["wins"] + tally["ties"] / 2) / n
    low, high = wilson_interval(rate, n)
    return {**result, "value": rate, "low": low, "high": high}


def wilson_interval(rate: float, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson's score interval for a proportion `rate` out of `n` (stays inside [0, 1], sane for small n)."""
    denominator = 1 + z * z / n
    centre = (rate + z * z / (2 * n)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
