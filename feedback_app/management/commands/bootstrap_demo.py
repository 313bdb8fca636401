from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from feedback_app.models import (
    EnvironmentSpec,
    Membership,
    PolicyVersion,
    Project,
    QueueItem,
    Role,
    RunStatus,
    Task,
    TrainingRun,
)
from feedback_app.models.queue import pairs_within_tasks
from feedback_app.models.trajectories import TaskSplit
from reward_models.envs import training_seeds
from reward_models.policy.bootstrap import BootstrapConfig
from reward_models.policy.tool_bootstrap import ToolBootstrapConfig
from training.launch import RolloutConfig, bootstrap_in_process, create_rollout_run, roll_out_here

GUIDELINES = """\
# Gridworld demo: how to label

The agent **A** must reach the goal **G** on a small map; `#` is a wall. Each turn the agent writes a short
reasoning (where it thinks the goal is) and one action: `up`, `down`, `left` or `right`.

- **Compare**: prefer the trajectory that reaches G, and among those the shorter one. If both fail, prefer the one
  that got closer or wasted fewer moves. Use *both bad* when neither makes real progress.
- **Step labels**: +1 for a move that brings A closer to G along a shortest path, 0 for a harmless detour,
  -1 for a move into a wall or away from the goal. *First error* marks the first -1 and everything before it +1.
- **Intervene** at the first bad move: pick the right action and say why in a few words.
"""

TOOL_GUIDELINES = """\
# Tool-use demo: how to label

The agent is a shop's assistant. It reads the customer's request and calls the shop's tools: `search`, `get_item`,
`add_to_cart`, `remove_from_cart`, `view_cart` and `checkout`. Each call shows its arguments, and the tool's answer
sits beside it.

- **Compare**: prefer the trajectory that checks out exactly what was asked (the right item, the right quantity),
  and among those the shorter one. A made-up item id, a wrong quantity or checking out too early is a failure.
- **Step labels**: +1 for a call that moves towards the order (a search for the named item, adding the id the search
  returned, checking out the right cart), 0 for a harmless detour (viewing the cart), -1 for a wrong id, a wrong
  quantity, broken arguments or an early answer. *First error* marks the first -1 and everything before it +1.
- **Intervene** at the first bad call: pick the tool and fill in its arguments (each is checked against the tool's
  schema), or write a reply, and say why in a few words. The agent then continues from your turn.
"""

DEMO_USERS = [("annotator", Role.ANNOTATOR), ("researcher", Role.RESEARCHER), ("admin", Role.ADMIN)]


@dataclass(frozen=True)
class Demo:
    """One demo project: its environment, its guidelines, and the bootstrap settings of its tiny policy."""

    slug: str
    name: str
    description: str
    guidelines: str
    environment: str
    dotted_path: str
    env_config: dict
    env_description: str
    quick: dict  # bootstrap settings for --quick


DEMOS = [
    Demo(
        "gridworld-demo",
        "Gridworld demo",
        "The built-in environment and tiny policy, ready for feedback.",
        GUIDELINES,
        "gridworld",
        "reward_models.envs.gridworld.GridWorld",
        # The tiny policy is trained for one map size: the demo environment matches its bootstrap.
        BootstrapConfig().env_config(),
        "The built-in text gridworld: reach G, avoid walls. Has an oracle.",
        {"n_episodes": 300, "max_train_steps": 30, "eval_tasks": 4},
    ),
    Demo(
        "tool-use-demo",
        "Tool-use demo",
        "A shop's assistant that calls tools with JSON arguments: chat turns, tool calls and tool results.",
        TOOL_GUIDELINES,
        "toolshop",
        "reward_models.envs.toolshop.ToolShop",
        ToolBootstrapConfig().env_config(),
        "The built-in shop with six JSON-schema tools: search, look up ids, fill the cart, check out. Has an oracle.",
        # The shipped weights are copied, not trained, so --quick only evaluates them on fewer tasks.
        {"eval_tasks": 4},
    ),
]


class Command(BaseCommand):
    help = (
        "Create the demos: the gridworld and tool-use projects, their tasks, the demo users, each one's "
        "bootstrapped tiny policy and a first batch of rollouts. Safe to run again: what exists is kept, nothing is "
        "trained twice."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--review-tasks", type=int, default=24, help="Tasks rolled out for annotators.")
        parser.add_argument("--train-tasks", type=int, default=200, help="Tasks for policy training rollouts.")
        parser.add_argument("--samples", type=int, default=2, help="Rollout samples per review task.")
        parser.add_argument(
            "--quick", action="store_true", help="A tiny, fast bootstrap (for tests and smoke checks, not the demo)."
        )

    def handle(self, *args, review_tasks: int, train_tasks: int, samples: int, quick: bool, **options) -> None:
        projects = []
        for demo in DEMOS:
            project = self._project(demo, review_tasks, train_tasks)
            logins = self._users(project)
            policy = self._policy(demo, project, quick)
            self._first_rollouts(project, policy, review_tasks, samples)
            self._queue(project, policy)
            projects.append(project)
        self.stdout.write("")
        for project in projects:
            self.stdout.write(self.style.SUCCESS(f"Demo project '{project.name}' is ready."))
        self.stdout.write("Demo logins (username / password):")
        for username, password, role in logins:
            self.stdout.write(f"  {username:<11} {password}   ({role})")

    def _project(self, demo: Demo, review_tasks: int, train_tasks: int) -> Project:
        with transaction.atomic():
            spec, _ = EnvironmentSpec.objects.get_or_create(
                name=demo.environment,
                defaults={
                    "dotted_path": demo.dotted_path,
                    "config": demo.env_config,
                    "description": demo.env_description,
                },
            )
            project, created = Project.objects.get_or_create(
                slug=demo.slug,
                defaults={
                    "name": demo.name,
                    "description": demo.description,
                    "guidelines": demo.guidelines,
                    "environment": spec,
                    "overlap": 2,
                },
            )
            if created or not project.tasks.exists():
                env = spec.load()
                splits = [
                    *((seed, TaskSplit.REVIEW) for seed in training_seeds(env, review_tasks)),
                    *((seed, TaskSplit.TRAIN) for seed in training_seeds(env, train_tasks, start=100_000)),
                    *((seed, TaskSplit.EVAL) for seed in env.eval_seeds()),
                ]
                Task.objects.bulk_create(
                    Task(
                        project=project,
                        seed=seed,
                        split=split,
                        spec=(t := env.make_task(seed)),
                        instruction=t["instruction"],
                    )
                    for seed, split in splits
                )
                self.stdout.write(f"Created project {project.slug} with {len(splits)} tasks.")
        return project

    def _users(self, project: Project) -> list[tuple[str, str, str]]:
        """Demo users get random passwords on their first creation, kept (mode 600) so later runs print them."""
        path = settings.DATA_DIR / "demo-logins.txt"
        known = (
            dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line) if path.exists() else {}
        )
        User = get_user_model()
        logins = []
        for username, role in DEMO_USERS:
            user = User.objects.filter(username=username).first()
            if user is None or username not in known:
                password = secrets.token_urlsafe(9)
                if user is None:
                    user = User(username=username, is_staff=role == Role.ADMIN, is_superuser=role == Role.ADMIN)
                user.set_password(password)
                user.save()
                known[username] = password
            Membership.objects.get_or_create(user=user, project=project, defaults={"role": role})
            logins.append((username, known[username], role))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text("".join(f"{name} {password}\n" for name, password in known.items()))
        return logins

    def _policy(self, demo: Demo, project: Project, quick: bool) -> PolicyVersion:
        policy = PolicyVersion.objects.filter(project=project, name="tiny-base").first()
        if policy is not None:
            self.stdout.write(f"{demo.name}: base policy kept: {policy.weights_path}")
            return policy
        config: dict = {"policy_name": "tiny-base"}
        if quick:
            config.update(demo.quick)
        self.stdout.write(f"{demo.name}: bootstrapping the tiny policy (first run only; a few minutes on a CPU)...")
        run = bootstrap_in_process(project, config)
        if run.status != RunStatus.SUCCEEDED:
            raise CommandError(f"Bootstrapping the policy failed:\n{run.error}")
        summary = run.summary
        self.stdout.write(
            f"Base policy: held-out success {summary['greedy_success']:.0%} greedy, "
            f"{summary['sampled_success']:.0%} sampled ({summary['wall_seconds']:.0f} s)."
        )
        return PolicyVersion.objects.get(pk=summary["policy_version"])

    def _first_rollouts(self, project: Project, policy: PolicyVersion, review_tasks: int, samples: int) -> None:
        done = TrainingRun.objects.filter(
            project=project, kind="rollout", base_policy=policy, status=RunStatus.SUCCEEDED
        ).exists()
        if done:
            return
        config = RolloutConfig(num_tasks=review_tasks, samples_per_task=samples, seed=0)
        run = create_rollout_run(project, policy, config)
        self.stdout.write(f"Rolling out {policy.name} on {review_tasks} review tasks × {samples} samples...")
        if roll_out_here(run) != RunStatus.SUCCEEDED:
            run.refresh_from_db()
            raise CommandError(f"The first rollouts failed:\n{run.error}")
        run.refresh_from_db()
        self.stdout.write(f"Stored {run.summary['trajectories']} trajectories.")

    def _queue(self, project: Project, policy: PolicyVersion) -> None:
        """Give the annotators work: every pair of the base policy's samples per task, and each trajectory for
        step labels. Pairs and trajectories already queued are skipped."""
        trajectories = list(project.trajectories.filter(policy_version=policy, parent__isnull=True))
        comparisons = QueueItem.objects.enqueue_comparisons(project, pairs_within_tasks(trajectories))
        step_items = QueueItem.objects.enqueue_trajectories(project, trajectories)
        if comparisons or step_items:
            self.stdout.write(f"Queued {len(comparisons)} comparisons and {len(step_items)} step-label items.")
