"""Shared fixtures. The users' names say on which side of the permission boundary they stand."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _pytest_temp_root() -> str:
    import getpass
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"pytest-of-{getpass.getuser()}")


# The tests build their tiny models in pytest's temporary folders, outside any project's artifact folders: they are
# the shared model roots, as an operator shares base models (feedback_app/models/locations.py). Celery worker
# processes the tests start read the same variable.
os.environ["TANDEM_SHARED_MODEL_ROOTS"] = _pytest_temp_root()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from reward_models.policy.bootstrap import BootstrapConfig  # noqa: E402
from tests.trajectories import save_steps  # noqa: E402


def pytest_configure(config) -> None:
    from django.conf import settings

    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    settings.TANDEM_SHARED_MODEL_ROOTS = [os.path.realpath(_pytest_temp_root())]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two test processes on two cores: one torch thread each, or each process's threads wait on the other's.
        import torch

        torch.set_num_threads(1)
        settings.TANDEM_TORCH_THREADS = 1  # the demo bootstrap's training too


# Tests are spread over the processes a module at a time, so that a module's fixtures are built once. Each process
# has its own database, data directory and broker (tests/xdist_env.py), so any module may run in any process. Modules
# are handed out in the order `pytest_collection_modifyitems` leaves them (xdist's own reordering, by number of tests,
# sends a module of a few long browser tests last, where one process then runs it alone).
@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False
    return LoadScopeScheduling(config, log)


# The modules that take longest, longest first (a module's total on two processes; `--durations=0` lists them). Handed
# out first, they leave the short modules to fill in at the end, so the processes finish close together.
SLOW_FIRST = (
    "tests/feedback_app/views/test_page_sweep_browser.py",
    "tests/reward_models/finetune/test_common.py",  # trains the shared short bootstrap
    "tests/feedback_app/api/test_fuzz.py",
    "tests/bench/test_feedback_types_smoke.py",
    "tests/reward_models/finetune/test_nash.py",
    "tests/feedback_app/test_tool_project.py",
    "tests/training/test_judge_worker.py",
    "tests/reward_models/reward/test_reward.py",
    "tests/reward_models/test_value.py",
    "tests/reward_models/finetune/test_ppo.py",
    "tests/feedback_app/test_bootstrap_demo.py",
    "tests/feedback_app/api/test_permissions.py",
    "tests/reward_models/test_prm.py",
    "tests/feedback_app/views/test_training_browser.py",
    "tests/feedback_app/views/test_dashboard.py",
    "tests/reward_models/finetune/test_grpo.py",
    "tests/feedback_app/simulated/test_annotator.py",
    "tests/reward_models/test_critic_lm.py",
    "tests/feedback_app/test_own_environment.py",
    "tests/reward_models/finetune/test_direction.py",
    "tests/reward_models/finetune/test_dpo.py",
    "tests/reward_models/policy/test_bootstrap.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: index for index, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.fixture
def gridworld_spec(db):
    from feedback_app.models import EnvironmentSpec

    return EnvironmentSpec.objects.create(
        name="gridworld-test",
        dotted_path="reward_models.envs.gridworld.GridWorld",
        config={},
        description="Built-in gridworld",
    )


@pytest.fixture
def project(db, gridworld_spec):
    from feedback_app.models import Project

    return Project.objects.create(
        name="Test project", environment=gridworld_spec, guidelines="# Be kind\nLabel carefully.", overlap=2
    )


def _member(django_user_model, project, username: str, role: str | None):
    from feedback_app.models import Membership

    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if role is not None:
        Membership.objects.create(user=user, project=project, role=role)
    return user


@pytest.fixture
def annotator(django_user_model, project):
    return _member(django_user_model, project, "annotator", "annotator")


@pytest.fixture
def other_annotator(django_user_model, project):
    return _member(django_user_model, project, "annotator2", "annotator")


@pytest.fixture
def researcher(django_user_model, project):
    return _member(django_user_model, project, "researcher", "researcher")


@pytest.fixture
def outsider(django_user_model, project):
    return _member(django_user_model, project, "outsider", None)


@pytest.fixture
def task(project):
    from feedback_app.models import Task

    return Task.objects.create(project=project, instruction="reach the goal", seed=7, spec={"seed": 7})


@pytest.fixture
def external_policy(project):
    from feedback_app.models import PolicyVersion

    return PolicyVersion.objects.create(project=project, name="agent-v1", kind="external")


@pytest.fixture
def make_trajectory(project, task, external_policy):
    """Build a small stored trajectory with `n_steps` steps."""
    from feedback_app.models import Step, Trajectory

    def make(n_steps: int = 3, **fields):
        fields.setdefault("task", task)
        fields.setdefault("policy_version", external_policy)
        fields.setdefault("source", "import")
        trajectory = Trajectory.objects.create(project=project, num_steps=n_steps, **fields)
        save_steps(
            trajectory,
            [Step(index=i, observation=f"obs {i}", reasoning=f"think {i}", action="up") for i in range(n_steps)],
        )
        return trajectory

    return make


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory):
    """An untrained tiny Llama policy directory, built from config in about a second."""
    from reward_models.envs.gridworld import GridWorld
    from reward_models.policy.bootstrap import vocabulary_corpus
    from reward_models.policy.model import build_tiny_llama, save_policy
    from reward_models.policy.tokenizer import build_word_tokenizer

    tokenizer = build_word_tokenizer(vocabulary_corpus(GridWorld()))
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("policy"), history_window=0, max_new_tokens=12)


@pytest.fixture
def tiny_policy(project, tiny_policy_dir):
    from feedback_app.models import PolicyVersion

    return PolicyVersion.objects.create(project=project, name="tiny", kind="local", weights_path=str(tiny_policy_dir))


@pytest.fixture
def demonstrations(project):
    """Gridworld episodes played by a person along a shortest path, with the demonstrator's reasoning: what an
    `sft` export holds as demonstrations."""
    from feedback_app.models import Step, Task, Trajectory
    from reward_models.envs.gridworld import GridWorld
    from reward_models.policy.bootstrap import goal_reasoning

    env = GridWorld()
    for seed in range(100, 106):
        spec = env.make_task(seed)
        task = Task.objects.create(project=project, seed=seed, instruction=spec["instruction"], spec=spec)
        oracle, observation, steps, done = env.oracle(spec), env.reset(spec), [], False
        while not done:
            action = oracle.best_actions([step.action for step in steps])[0]
            result = env.step(action)
            steps.append(
                Step(index=len(steps), observation=observation, reasoning=goal_reasoning(observation), action=action)
            )
            observation, done = result.observation, result.done
        trajectory = Trajectory.objects.create(
            project=project, task=task, source="human", num_steps=len(steps), success=True
        )
        save_steps(trajectory, steps)


@pytest.fixture
def review_tasks(project):
    from feedback_app.models import Task

    return Task.objects.bulk_create(
        Task(
            project=project,
            seed=seed,
            split="review",
            instruction="reach the goal G",
            spec={"seed": seed, "instruction": "reach the goal G"},
        )
        for seed in range(3)
    )


def _database_url_for_subprocess() -> str:
    """The URL of the database the tests use right now (the test database, not the configured one)."""
    from django.db import connection

    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    host, port = params["HOST"] or "localhost", params["PORT"] or 5432
    return f"postgres://{params['USER']}:{params['PASSWORD']}@{host}:{port}/{params['NAME']}"


def start_celery_worker(log_path, *, purge: bool = True, extra_env: dict[str, str] | None = None):
    """Start a real Celery worker process (solo pool, every queue) on the configured broker, reading and writing
    the test database, and wait until it is ready. The process gets a `log_path` attribute."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for_subprocess(),
        "TANDEM_TORCH_THREADS": "1",
        **(extra_env or {}),
    }
    command = [sys.executable, "-m", "celery", "-A", "training", "worker", "--pool", "solo"]
    command += ["--purge"] if purge else []
    command += ["-Q", "rollouts,training,default", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent
        )
    deadline = time.monotonic() + 90
    while "ready." not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the Celery worker did not start:\n{log_path.read_text()}")
        time.sleep(0.2)
    process.log_path = log_path
    return process


@pytest.fixture
def celery_workers(transactional_db, tmp_path):
    """Starts real Celery worker processes (`celery_workers(purge=..., extra_env=...)`) and stops them all after the
    test."""
    import subprocess

    started = []

    def start(*, purge: bool = True, extra_env: dict[str, str] | None = None):
        process = start_celery_worker(tmp_path / f"worker-{len(started)}.log", purge=purge, extra_env=extra_env)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
    for process in started:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def celery_worker_process(celery_workers):
    """A real Celery worker process on the configured broker, reading and writing the test database."""
    return celery_workers()


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium driven through Playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def browser_page_for(chromium, live_server):
    """`browser_page_for(user)` opens a page logged in as `user` (session cookie set directly, as after a login)."""
    from django.conf import settings
    from django.test import Client

    contexts = []

    def open_page(user, *, width: int = 1280, height: int = 900):
        client = Client()
        client.force_login(user)
        # Playwright's wait_for_function compiles its predicate with eval, which Tandem's Content-Security-Policy
        # forbids; the page sweep checks the policy itself, in contexts of its own.
        context = chromium.new_context(
            viewport={"width": width, "height": height}, base_url=live_server.url, bypass_csp=True
        )
        context.add_cookies(
            [
                {
                    "name": settings.SESSION_COOKIE_NAME,
                    "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                    "url": live_server.url,
                }
            ]
        )
        context.set_default_timeout(60_000)  # generous: CI machines are small and shared
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def docs_dir():
    """Where browser tests save the docs' screenshots."""
    from pathlib import Path

    path = Path(__file__).parent.parent / "docs"
    path.mkdir(exist_ok=True)
    return path


# --- trained model directories shared by reward_models/ and finetune/ tests (built once per session) ------------

# Small enough to run in a few seconds, long enough that the policy writes well-formed turns.
SHORT_BOOTSTRAP = {
    "seed": 7,
    "n_episodes": 400,
    "max_train_steps": 60,
    "warmup_steps": 5,
    "batch_size": 64,
    "eval_tasks": 16,
    "lr": 3e-3,
    # One thread, as each test process has (two processes share two cores); the results depend on it.
    "num_threads": 1,
    # The default wall-clock budget would cut the run short on a loaded machine and make it nondeterministic.
    "max_seconds": 1800.0,
}


def _short_bootstrap_config(output_dir: Path, **overrides: Any) -> BootstrapConfig:
    return BootstrapConfig(output_dir=str(output_dir), **{**SHORT_BOOTSTRAP, **overrides})


@pytest.fixture
def short_bootstrap_config():
    """Builds a BootstrapConfig for a seconds-long run: ``short_bootstrap_config(output_dir, **overrides)``."""
    return _short_bootstrap_config


@pytest.fixture(scope="session")
def bootstrapped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A policy directory from a short bootstrap run, and the run's metrics (its metrics.json). The run is
    deterministic, so under pytest-xdist the first process to need it trains it and the others wait for it and read
    it, instead of each spending most of a minute on the same run."""
    import fcntl
    import json

    from reward_models.policy.bootstrap import main

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        output_dir = tmp_path_factory.mktemp("bootstrap") / "policy"
        return output_dir, main(_short_bootstrap_config(output_dir))
    shared = tmp_path_factory.getbasetemp().parent / "bootstrap"  # the test processes' common folder
    shared.mkdir(exist_ok=True)
    output_dir = shared / "policy"
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (output_dir / "metrics.json").exists():
            main(_short_bootstrap_config(output_dir))
    return output_dir, json.loads((output_dir / "metrics.json").read_text())


@pytest.fixture(scope="session")
def policy_dir(bootstrapped: tuple[Path, dict[str, Any]]) -> Path:
    return bootstrapped[0]


@pytest.fixture(scope="session")
def local_policy(policy_dir: Path):
    from reward_models.policy.local import LocalCausalLMPolicy

    return LocalCausalLMPolicy(policy_dir)


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory) -> Path:
    """An untrained tiny Llama directory whose word tokenizer covers every word of `simulation.oracle_data`'s
    rows (gridworld turns, transcript roles, critique templates): the base model of the judge-pipeline tests."""
    from simulation.oracle_data import build_tiny_base

    return build_tiny_base(tmp_path_factory.mktemp("base") / "tiny")


@pytest.fixture
def artifact_root(settings, tmp_path):
    """Run artifacts (snapshots, models) under the test's own temporary directory."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    return settings.ARTIFACT_ROOT
