"""The tool-use shop through the whole app: its built-in policy rolls out, an annotator labels the chat
trajectories through the API (comparisons, step labels, ratings, critiques, interventions that edit a tool call),
the researcher takes snapshots, and every judge kind and every policy method is launched through the API, as on the
gridworld, and trains on those labels."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from feedback_app.models import (
    EnvironmentSpec,
    Membership,
    PolicyVersion,
    Project,
    RegisteredModel,
    RunStatus,
    Task,
    TrainingRun,
)
from feedback_app.models.trajectories import TaskSplit
from reward_models.envs.base import message_action
from reward_models.envs.toolshop import ToolShop
from reward_models.policy.tool_bootstrap import SHIPPED_DIR
from training.judges import run_judge
from training.policy_runs import POLICY_RUN_KINDS, run_policy_training
from training.rollouts import RolloutConfig, create_rollout_run, run_rollout
from training.runs import RunRecorder, execute_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_root")]

DIFFICULTY = 2  # the shop's default, where the built-in policy succeeds part of the time

JUDGE = {"max_steps": 2, "batch_size": 4, "save_steps": 1000, "logging_steps": 1}
POLICY = {"eval_tasks": 1, "save_steps": 1000, "logging_steps": 1, "learning_rate": 1e-3}
RUNS = {
    "reward_model": ("preference", JUDGE),
    "preference_model": ("preference", JUDGE),
    "prm": ("stepwise", JUDGE),
    "value_critic": ("returns", JUDGE),
    "generative_critic": ("critiques", JUDGE),
    "sft": ("sft", {**POLICY, "max_steps": 2, "batch_size": 2}),
    # A handful of corrections holds no cycle of actions to balance: every pair trains.
    "dpo": ("step_preference", {**POLICY, "max_steps": 2, "batch_size": 2, "balance": "none"}),
    "kto": ("unpaired", {**POLICY, "max_steps": 2, "batch_size": 4}),
    "ppo": (
        None,
        {**POLICY, "max_steps": 1, "rollouts_per_step": 4, "batch_size": 8, "ppo_epochs": 1, "selection_tasks": 2},
    ),
    "nash_md": (None, {**POLICY, "max_steps": 1, "batch_size": 2}),
    "spo": (None, {**POLICY, "max_steps": 1, "batch_size": 2}),
    "grpo": (None, {**POLICY, "max_steps": 1, "prompts_per_step": 2, "num_generations": 2, "train_prompts": 4}),
}
JUDGES_OF = {
    "ppo": {"reward_model_path": "reward_model", "prm_path": "prm"},
    "nash_md": {"preference_model_path": "preference_model"},
    "spo": {"preference_model_path": "reward_model"},
    "grpo": {"reward_model_path": "reward_model"},
}


@pytest.fixture(scope="module")
def shipped_copy(tmp_path_factory):
    """The shipped tool policy, copied where the tests keep their models (a shared model root)."""
    path = tmp_path_factory.mktemp("toolshop") / "policy"
    shutil.copytree(SHIPPED_DIR, path)
    return path


@pytest.fixture
def shop(researcher, annotator, shipped_copy):
    env = ToolShop(difficulty=DIFFICULTY)
    spec = EnvironmentSpec.objects.create(
        name="shop", dotted_path="reward_models.envs.toolshop.ToolShop", config={"difficulty": DIFFICULTY}
    )
    project = Project.objects.create(name="Shop", slug="shop", environment=spec)
    for user, role in ((researcher, "researcher"), (annotator, "annotator")):
        Membership.objects.create(user=user, project=project, role=role)
    splits = [(seed, TaskSplit.REVIEW) for seed in range(3)] + [(seed, TaskSplit.TRAIN) for seed in range(100, 104)]
    splits += [(seed, TaskSplit.EVAL) for seed in list(env.eval_seeds())[:4]]
    for seed, split in splits:
        spec = env.make_task(seed)
        Task.objects.create(project=project, seed=seed, split=split, spec=spec, instruction=spec["instruction"])
    policy = PolicyVersion.objects.create(
        project=project, name="tiny-base", kind="local", weights_path=str(shipped_copy)
    )
    return project, policy


def _label_through_the_api(client, project, env) -> None:
    """Oracle-guided labels on every rolled-out trajectory, through the API as an annotator's client sends them."""
    base = f"/api/projects/{project.pk}/"

    def actions(steps) -> list:
        return [message_action(env, step.message) for step in steps]

    trajectories = list(project.trajectories.order_by("task_id", "pk"))
    by_task: dict[int, list] = {}
    for trajectory in trajectories:
        by_task.setdefault(trajectory.task_id, []).append(trajectory)

    def progress(trajectory) -> float:
        return env.oracle(trajectory.task.spec).progress_return(actions(trajectory.steps.order_by("index")))

    for a, b, *_ in (group for group in by_task.values() if len(group) > 1):
        returns = progress(a), progress(b)
        choice = "tie" if returns[0] == returns[1] else "a" if returns[0] > returns[1] else "b"
        body = {"trajectory_a": a.pk, "trajectory_b": b.pk, "choice": choice}
        assert client.post(base + "comparisons/", body, format="json").status_code == 201
    corrected = 0
    for trajectory in trajectories:
        steps = list(trajectory.steps.order_by("index"))
        oracle = env.oracle(trajectory.task.spec)
        correct = oracle.step_correct(actions(steps))
        for step, ok in zip(steps, correct, strict=True):
            body = {"step": step.pk, "value": 1 if ok else -1}
            assert client.post(base + "step-labels/", body, format="json").status_code == 201
        wrong = next((index for index, ok in enumerate(correct) if not ok), None)
        body = {"trajectory": trajectory.pk, "thumb_up": oracle.success(actions(steps))}
        assert client.post(base + "ratings/", body, format="json").status_code == 201
        text = "fine" if wrong is None else "this call goes wrong"
        step = steps[wrong if wrong is not None else -1]
        body = {"trajectory": trajectory.pk, "step": step.pk, "text": text}
        assert client.post(base + "critiques/", body, format="json").status_code == 201
        if wrong is not None:
            best = oracle.best_actions(actions(steps[:wrong]))[0]
            body = {"trajectory": trajectory.pk, "step": steps[wrong].pk, "corrected_message": best, "reason": "ok"}
            response = client.post(base + "interventions/", body, format="json")
            assert response.status_code == 201, response.json()
            corrected += 1
    assert corrected, "the base policy made no mistake to correct"


def test_every_judge_and_policy_method_trains_on_tool_labels_launched_through_the_api(
    api_as, shop, researcher, annotator
):
    project, policy = shop
    rollout = create_rollout_run(project, policy, RolloutConfig(num_tasks=3, samples_per_task=2, seed=0))
    assert execute_run(rollout.pk, run_rollout) == RunStatus.SUCCEEDED
    assert project.trajectories.count() == 6
    _label_through_the_api(api_as(annotator), project, ToolShop(difficulty=DIFFICULTY))

    client = api_as(researcher)
    snapshots = {}
    for kind in sorted({snapshot for snapshot, _ in RUNS.values() if snapshot}):
        response = client.post(
            f"/api/projects/{project.pk}/snapshots", {"name": kind, "export_kind": kind}, format="json"
        )
        assert response.status_code == 201, response.json()
        assert response.json()["row_count"] > 0, kind
        snapshots[kind] = response.json()["id"]

    models: dict[str, int] = {}
    for kind, (snapshot, config) in RUNS.items():
        body = {"kind": kind, "config": config, "base_policy": policy.pk}
        if snapshot:
            body["snapshot"] = snapshots[snapshot]
        if kind in JUDGES_OF:
            body["judges"] = {setting: models[judge] for setting, judge in JUDGES_OF[kind].items()}
        trains_policy = kind in POLICY_RUN_KINDS
        if trains_policy:
            body["review"] = {"enabled": False}
        response = client.post(f"/api/projects/{project.pk}/runs/", body, format="json")
        assert response.status_code == 201, (kind, response.json())
        run_id = response.json()["id"]
        work = run_policy_training if trains_policy else run_judge
        execute_run(run_id, work, lambda pk: RunRecorder(pk, check_interval=0.0))
        run = TrainingRun.objects.get(pk=run_id)
        assert run.status == RunStatus.SUCCEEDED, (kind, run.error)
        if not trains_policy:
            models[kind] = RegisteredModel.objects.get(run=run).pk
        else:
            child = PolicyVersion.objects.get(produced_by=run)
            assert child.parent == policy and (Path(child.weights_path) / "model.safetensors").is_file()
