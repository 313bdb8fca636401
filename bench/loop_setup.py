"""What bench/loop.py runs on and what it writes through the ORM: the environments (their classes, settings,
base policies and how the judges read them), the base policy directory, and the set-up of a fresh Tandem (the
researcher, the crowd, one project per case). The rest of the loop goes through the REST API."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _gridworld_config() -> dict[str, Any]:
    from reward_models.policy.bootstrap import BootstrapConfig

    return BootstrapConfig().env_config()


def _gridworld_base(path: Path) -> None:
    """The tiny gridworld Llama, trained for seed 0 (2-3 minutes)."""
    from reward_models.policy.bootstrap import BootstrapConfig
    from reward_models.policy.bootstrap import main as bootstrap

    bootstrap(BootstrapConfig(output_dir=str(path), seed=0, max_seconds=1800.0))


def _toolshop_config() -> dict[str, Any]:
    from reward_models.policy.tool_bootstrap import ToolBootstrapConfig

    return ToolBootstrapConfig().env_config()


def _toolshop_base(path: Path) -> None:
    """The shipped tool-calling Qwen2, copied (seconds)."""
    from reward_models.policy.tool_bootstrap import ToolBootstrapConfig
    from reward_models.policy.tool_bootstrap import main as bootstrap

    bootstrap(ToolBootstrapConfig(output_dir=str(path), eval_tasks=8))


def _careless_config() -> dict[str, Any]:
    from simulation.careless_agent import ENVIRONMENT_CONFIG

    return dict(ENVIRONMENT_CONFIG)


def _careless_base(path: Path) -> None:
    """The shipped tool-calling Qwen2, fine-tuned to slip (a few minutes)."""
    from simulation.careless_agent import build_careless_agent

    build_careless_agent(path)


@dataclass(frozen=True)
class Environment:
    """A registered environment the loop runs on: where its class lives, its settings, how its base policy is made,
    and how its judges read it."""

    name: str
    dotted_path: str
    config: Callable[[], dict[str, Any]]
    bootstrap: Callable[[Path], None]
    # The reward model's layout (`reward_models.reward`); None reads whole conversations.
    reward_layout: str | None
    # Whether the reward model is also scored on oracle-ordered test pairs (`oracle_test_pairs`): the gridworld's
    # scripted episodes make them.
    oracle_pairs: bool


ENVIRONMENTS = {
    # The first and last map and the actions, not the policy's reasoning: a `decisions` reward model (reasoning
    # included) scored a PPO policy that writes "goal is down 0" and never moves above the base policy's failures
    # more than a `moves` one does, at the same oracle-pair accuracy, and a `moves` model trains faster.
    "gridworld": Environment(
        "gridworld", "reward_models.envs.gridworld.GridWorld", _gridworld_config, _gridworld_base, "moves", True
    ),
    # Tool calls and their results: the reward model reads the whole conversation, tools included.
    "toolshop": Environment(
        "toolshop", "reward_models.envs.toolshop.ToolShop", _toolshop_config, _toolshop_base, None, False
    ),
    # The same shop at difficulty 1, played by an agent that knows every step and slips at temperature 1
    # (`simulation.careless_agent`): failures feedback can fix, where the shipped policy's at difficulty 2 are a
    # skill it lacks.
    "toolshop_careless": Environment(
        "toolshop_careless", "reward_models.envs.toolshop.ToolShop", _careless_config, _careless_base, None, False
    ),
}


def base_policy(args: argparse.Namespace, work: Path) -> Path:
    if args.policy:
        return Path(args.policy).resolve()
    path = work / f"base-policy-{args.env}"
    if not (path / "config.json").is_file():
        print(f"making the base policy in {path} (kept for later runs)", flush=True)
        ENVIRONMENTS[args.env].bootstrap(path)
    return path.resolve()


def set_up(args: argparse.Namespace, cases: list[str], policy_dir: Path, crowd: list[dict]) -> dict[str, Any]:
    """A researcher, the crowd and one project per case (the same tasks and base policy in each); their ids and
    API keys."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from feedback_app.models import ApiToken, EnvironmentSpec, Membership, PolicyVersion, Project, Role, Task
    from feedback_app.models.trajectories import TaskSplit
    from reward_models.envs import training_seeds

    User = get_user_model()
    environment = ENVIRONMENTS[args.env]
    spec, _ = EnvironmentSpec.objects.get_or_create(
        name=environment.name, defaults={"dotted_path": environment.dotted_path, "config": environment.config()}
    )
    env = spec.load()
    seeds = list(training_seeds(env, args.tasks * args.rounds, start=args.seed * 1_000_000 + 500_000))
    researcher = User.objects.create_user("loop-researcher")
    annotators = [User.objects.create_user(f"sim-{member['name']}") for member in crowd]
    setup: dict[str, Any] = {
        "researcher_key": ApiToken.issue(researcher, "loop bench")[1],
        "crowd_keys": [ApiToken.issue(user, "loop bench")[1] for user in annotators],
        "projects": {},
    }
    for case in cases:
        project = Project.objects.create(
            name=f"Loop bench: {case}", slug=f"loop-{case}", environment=spec, overlap=1, blind=True, gold_fraction=0
        )
        Membership.objects.create(user=researcher, project=project, role=Role.RESEARCHER)
        Membership.objects.bulk_create(Membership(user=u, project=project, role=Role.ANNOTATOR) for u in annotators)
        tasks = Task.objects.bulk_create(
            Task(
                project=project,
                seed=seed,
                split=TaskSplit.TRAIN,
                spec=(t := env.make_task(seed)),
                instruction=t["instruction"],
            )
            for seed in seeds
        )
        policy = PolicyVersion.objects.create(
            project=project, name="tiny-base", kind="local", weights_path=str(policy_dir)
        )
        setup["projects"][case] = {
            "id": project.pk,
            "policy": policy.pk,
            "tasks": [task.pk for task in sorted(tasks, key=lambda t: t.pk)],
        }
    return setup
