"""The database of bench/annotate_load.py: a fresh PostgreSQL database (its name must say "bench": it is dropped
first and at the end), seeded through the ORM with a gridworld project, its trajectories and comparison items, the
labels earlier annotators gave before the run and the simulated annotators' accounts, and checked after the run."""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import sys
import uuid
from urllib.parse import urlparse

PASSWORD = "bench-" + secrets.token_hex(8)  # every annotator's, seeded here and typed into the login form
PAIRS_PER_TASK = 15  # six trajectories of each task, every pair queued


def fresh_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    if parsed.scheme not in ("postgres", "postgresql") or "bench" not in name:
        sys.exit(f"DATABASE_URL must name a PostgreSQL database with 'bench' in its name (it is dropped), got {url!r}")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parsed.path.lstrip("/")}" WITH (FORCE)')


def gridworld_steps(env, spec: dict, rng: random.Random, skill: float) -> list[dict]:
    """One episode: the oracle's best move with probability `skill`, else a random move."""
    from simulation.episodes import skilled_walk

    steps = []
    for index, observation, action, on_course, result in skilled_walk(env, spec, rng, skill):
        reasoning = "the goal is that way" if on_course else "walls everywhere, try another way"
        steps.append(
            {
                "index": index,
                "observation": observation,
                "reasoning": reasoning,
                "action": action,
                "env_reward": result.reward,
                "done": result.done,
                "render": env.render(observation),
                "message": env.message_for_action(action, reasoning),
                "replies": [{"role": "user", "content": result.observation}],
            }
        )
    return steps


def seed(args: argparse.Namespace, items_wanted: int) -> tuple[int, list[str]]:
    """A gridworld project with enough comparison items, the labels it had before the run, and the annotators.
    Returns the project id and the annotators' usernames."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import connection, transaction

    from feedback_app.models import (
        EnvironmentSpec,
        Membership,
        PolicyVersion,
        Project,
        QueueItem,
        Step,
        Task,
        Trajectory,
    )
    from feedback_app.models.queue import pairs_within_tasks
    from reward_models.envs.base import prompt_messages
    from reward_models.envs.gridworld import GridWorld

    env, rng = GridWorld(), random.Random(0)
    items_done = -(-args.labelled_before // args.overlap)
    tasks = -(-(items_wanted + items_done) // PAIRS_PER_TASK)
    with transaction.atomic():
        spec = EnvironmentSpec.objects.create(name="gridworld", dotted_path="reward_models.envs.gridworld.GridWorld")
        project = Project.objects.create(
            name="Load benchmark", environment=spec, overlap=args.overlap, guidelines="Prefer the shorter path."
        )
        policies = [
            PolicyVersion.objects.create(project=project, name=f"agent-v{n}", kind="external") for n in range(3)
        ]
        task_rows = Task.objects.bulk_create(
            Task(project=project, seed=seed, spec=env.make_task(seed), instruction=env.make_task(seed)["instruction"])
            for seed in range(tasks)
        )
        episodes = [
            (task, gridworld_steps(env, task.spec, rng, rng.uniform(0.3, 1.0))) for task in task_rows for _ in range(6)
        ]
        trajectories = Trajectory.objects.bulk_create(
            Trajectory(
                project=project,
                task=task,
                policy_version=rng.choice(policies),
                source="import",
                prompt=prompt_messages(env, task.spec, steps[0]["observation"]) if steps else [],
                num_steps=len(steps),
                success=bool(steps and steps[-1]["done"] and steps[-1]["env_reward"] > 0),
            )
            for task, steps in episodes
        )
        Step.objects.bulk_create(
            (
                Step(trajectory=trajectory, **step)
                for trajectory, (_, steps) in zip(trajectories, episodes, strict=True)
                for step in steps
            ),
            batch_size=2000,
        )
        items = QueueItem.objects.enqueue_comparisons(project, pairs_within_tasks(trajectories))
        password = make_password(PASSWORD)  # hashed once: every annotator shares it
        users = get_user_model().objects.bulk_create(
            get_user_model()(username=f"bench-{n:03d}", password=password) for n in range(args.annotators)
        )
        Membership.objects.bulk_create(Membership(user=user, project=project, role="annotator") for user in users)
        label_before(project, items[:items_done], password, rng)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    mean_steps = statistics.mean(len(steps) for _, steps in episodes)
    print(
        f"seeded {len(trajectories)} trajectories ({mean_steps:.1f} steps on average), "
        f"{len(items)} comparison items × overlap {args.overlap} ({items_done} labelled before the run), "
        f"{len(users)} annotators"
    )
    return project.pk, [user.username for user in users]


EARLIER = "earlier-"  # the usernames of the annotators who labelled before the run


def label_before(project, items: list, password: str, rng: random.Random) -> None:
    """Fill `items` with labels by earlier annotators, as the queue would have: a done assignment per slot and its
    comparison, the items' completed counts at their overlap."""
    from django.contrib.auth import get_user_model
    from django.db.models import F
    from django.utils import timezone

    from feedback_app.models import Assignment, Comparison, Membership, QueueItem
    from feedback_app.models.queue import AssignmentStatus

    users = get_user_model().objects.bulk_create(
        get_user_model()(username=f"{EARLIER}{n:02d}", password=password) for n in range(20)
    )
    Membership.objects.bulk_create(Membership(user=user, project=project, role="annotator") for user in users)
    now = timezone.now()
    slots = [(item, slot, user) for item in items for slot, user in enumerate(rng.sample(users, item.overlap))]
    assignments = Assignment.objects.bulk_create(
        (
            Assignment(item=item, annotator=user, slot=slot, status=AssignmentStatus.DONE, leased_until=now,
                       finished_at=now)
            for item, slot, user in slots
        ),
        batch_size=2000,
    )  # fmt: skip
    Comparison.objects.bulk_create(
        (
            Comparison(project=project, annotator=user, assignment=assignment, trajectory_a_id=item.trajectory_id,
                       trajectory_b_id=item.other_trajectory_id, choice=rng.choice(["a", "b", "tie", "both_bad"]),
                       strength=rng.choice([1, 2, 3]), client_token=uuid.uuid4(), seconds_spent=rng.uniform(2, 20))
            for (item, _, user), assignment in zip(slots, assignments, strict=True)
        ),
        batch_size=2000,
    )  # fmt: skip
    QueueItem.objects.filter(pk__in=[item.pk for item in items]).update(completed_count=F("overlap"))


def check_database(project_pk: int, overlap: int, successful: int) -> list[str]:
    """The invariants after the run: one stored label per successful submit, no item labelled beyond its overlap
    (the labels from before the run included)."""
    from django.db import connections
    from django.db.models import Count, F, Q

    from feedback_app.models import Assignment, Comparison, QueueItem
    from feedback_app.models.queue import AssignmentStatus

    connections.close_all()
    problems = []
    stored = Comparison.objects.filter(project_id=project_pk).count()
    during = Comparison.objects.filter(project_id=project_pk).exclude(annotator__username__startswith=EARLIER).count()
    if during != successful:
        problems.append(f"{during} comparisons stored during the run but {successful} submits succeeded")
    done = Q(assignments__status=AssignmentStatus.DONE)
    items = QueueItem.objects.filter(project_id=project_pk).annotate(done=Count("assignments", filter=done))
    pairs = Comparison.objects.filter(project_id=project_pk, is_current=True).values("trajectory_a", "trajectory_b")
    labelled_twice = Assignment.objects.filter(item__project_id=project_pk, status=AssignmentStatus.DONE)
    for count, what in [
        (items.filter(completed_count__gt=F("overlap")).count(), "items completed beyond their overlap"),
        (items.filter(done__gt=F("overlap")).count(), "items with more labelled slots than their overlap"),
        (items.exclude(done=F("completed_count")).count(), "items whose completed count differs from their slots"),
        (pairs.annotate(n=Count("pk")).filter(n__gt=overlap).count(), "pairs with more labels than the overlap"),
        (stored - labelled_twice.count(), "labels without a labelled slot (or slots without a label)"),
    ]:
        if count:
            problems.append(f"{count} {what}")
    return problems
