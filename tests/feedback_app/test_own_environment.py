"""An environment from outside Tandem's package, exactly as the docs' guide writes it (docs/environments.md), taken
through the whole app: registered by dotted path, rolled out by an agent behind an OpenAI-compatible endpoint, shown
on the annotator pages, labelled through the API, exported, and a judge trained on the export."""

from __future__ import annotations

import json
import random
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.urls import reverse

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
from training.judges import run_judge
from training.rollouts import RolloutConfig, create_rollout_run, run_rollout
from training.runs import RunRecorder, execute_run

pytestmark = pytest.mark.django_db

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
MODULE = "my_envs_counter"


class CountingAgent(BaseHTTPRequestHandler):
    """An agent behind ``/v1/chat/completions``: it reads the value and target from the last user turn and adds 2
    while that does not overshoot, else 1; sampling, it adds 2 half the time, whatever the target."""

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        value, target = map(int, re.findall(r"\d+", last)[:2])
        move = "+2" if value + 2 <= target else "+1"
        if body.get("temperature") and random.Random(f"{body.get('seed')}-{last}").random() < 0.5:
            move = "+2"
        message = {"role": "assistant", "content": move}
        data = json.dumps({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def guide_environment(tmp_path, monkeypatch):
    """The guide's Counter, as a module of its own outside the package."""
    [example] = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    (tmp_path / f"{MODULE}.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{MODULE}.Counter"
    sys.modules.pop(MODULE, None)


@pytest.fixture
def agent_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), CountingAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_an_environment_from_outside_the_package_goes_through_rollout_pages_labels_export_and_training(
    settings, tmp_path, guide_environment, agent_url, client, api_as, annotator, researcher, tiny_base_model
):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.TANDEM_ENDPOINT_ALLOWLIST = ["127.0.0.1"]
    spec = EnvironmentSpec.objects.create(name="counter", dotted_path=guide_environment, config={"limit": 9})
    project = Project.objects.create(name="Counter", environment=spec)
    for user, role in ((researcher, "researcher"), (annotator, "annotator")):
        Membership.objects.create(user=user, project=project, role=role)
    env = spec.load()
    for seed in range(4):
        task = env.make_task(seed)
        Task.objects.create(
            project=project, seed=seed, split=TaskSplit.REVIEW, spec=task, instruction=task["instruction"]
        )
    policy = PolicyVersion.objects.create(
        project=project, name="counting-agent", kind="endpoint", endpoint_url=agent_url
    )

    rollout = create_rollout_run(project, policy, RolloutConfig(num_tasks=4, samples_per_task=2, seed=0))
    assert execute_run(rollout.pk, run_rollout) == RunStatus.SUCCEEDED, TrainingRun.objects.get(pk=rollout.pk).error
    trajectories = list(project.trajectories.order_by("task_id", "pk"))
    assert len(trajectories) == 8 and all(t.num_steps >= 2 for t in trajectories)
    first = trajectories[0].steps.order_by("index").first()
    assert first.message == {"role": "assistant", "content": first.action} and first.action in ("+1", "+2")

    # The annotator's pages show its text observations and offer its legal actions.
    client.force_login(annotator)
    steps_page = client.get(reverse("trajectory-steps", args=[project.pk, trajectories[0].pk])).content.decode()
    assert "value 0, target" in steps_page
    intervene = client.get(reverse("intervene", args=[project.pk, trajectories[0].pk, 0])).content.decode()
    assert 'name="pick" value="+1"' in intervene and 'name="pick" value="+2"' in intervene

    # Labels through the API: the pair that reached its target exactly wins, and every step of a winner is good.
    base = f"/api/projects/{project.pk}/"
    annotating = api_as(annotator)
    compared = 0
    for a, b in zip(trajectories[::2], trajectories[1::2], strict=True):
        won = {t.pk: bool(t.steps.order_by("-index").first().env_reward) for t in (a, b)}
        choice = "tie" if won[a.pk] == won[b.pk] else "a" if won[a.pk] else "b"
        body = {"trajectory_a": a.pk, "trajectory_b": b.pk, "choice": choice}
        assert annotating.post(base + "comparisons/", body).status_code == 201
        compared += choice != "tie"
    assert compared, "every pair tied: the sampled agent never overshot"
    for step in trajectories[0].steps.all():
        assert annotating.post(base + "step-labels/", {"step": step.pk, "value": 1}).status_code == 201

    # An export, frozen as a snapshot, and a reward model trained on it through the API.
    researching = api_as(researcher)
    snapshot = researching.post(base + "snapshots", {"name": "prefs", "export_kind": "preference"})
    assert snapshot.status_code == 201 and snapshot.json()["row_count"] == compared
    config = {"max_steps": 2, "batch_size": 2, "save_steps": 1000, "logging_steps": 1}
    launch = {"kind": "reward_model", "snapshot": snapshot.json()["id"], "base_model": str(tiny_base_model)}
    response = researching.post(base + "runs/", {**launch, "config": config})
    assert response.status_code == 201, response.json()
    run_id = response.json()["id"]
    execute_run(run_id, run_judge, lambda pk: RunRecorder(pk, check_interval=0.0))
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert RegisteredModel.objects.filter(run=run, kind="reward_model").exists()
