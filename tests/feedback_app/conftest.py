"""Fixtures the web app's tests share."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from feedback_app.models import (
    DatasetSnapshot,
    EnvironmentSpec,
    Membership,
    Project,
    QueueItem,
    RegisteredModel,
    RunStatus,
    TrainingRun,
)
from reward_models.envs.toolshop_tools import TOOLS


@pytest.fixture
def api_as():
    """api_as(user) -> an APIClient logged in as `user` (session authentication)."""

    def make(user) -> APIClient:
        client = APIClient()
        client.default_format = "json"
        client.force_login(user)
        return client

    return make


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


TRANSCRIPT = [
    {"role": "system", "content": "You are a shopping assistant."},
    {"role": "user", "content": "Buy the red mug, quantity 2."},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [_call("call_a", "search", '{"query": "mug"}')]},
    {"role": "tool", "tool_call_id": "call_a", "name": "search", "content": '[{"name": "red mug", "id": "kq48"}]'},
    {"role": "assistant", "content": None, "tool_calls": [_call("call_b", "add_to_cart", '{"item_id": "kq48"}')]},
    {"role": "tool", "tool_call_id": "call_b", "name": "add_to_cart", "content": "error: quantity missing"},
]


@pytest.fixture
def shop(researcher, annotator, api_as):
    """A tool-use project with one imported trajectory whose task has a seed (replayable) and one without."""
    spec = EnvironmentSpec.objects.create(name="shop", dotted_path="reward_models.envs.toolshop.ToolShop", config={})
    project = Project.objects.create(name="Shop", environment=spec)
    for user, role in ((researcher, "researcher"), (annotator, "annotator")):
        Membership.objects.create(user=user, project=project, role=role)
    tasks = {"seeded": {"seed": 3, "external_id": "shop-3"}, "bare": {"external_id": "shop-x"}}
    rows = [
        {"external_id": name, "task": task, "messages": TRANSCRIPT, "tools": TOOLS} for name, task in tasks.items()
    ]
    imported = api_as(researcher).post(
        f"/api/projects/{project.pk}/trajectories/import", json.dumps(rows), content_type="application/json"
    )
    assert imported.status_code == 200, imported.content
    return project, project.trajectories.get(external_id="seeded"), project.trajectories.get(external_id="bare")


# The compare page's items.


@pytest.fixture
def pair(make_trajectory):
    """A 3-step and a 5-step trajectory of the same task, queued for comparison."""
    short = make_trajectory(3, success=True, outcome_return=1.0)
    long = make_trajectory(5, success=False, outcome_return=0.0)
    item = QueueItem.objects.enqueue_comparisons(short.project, [(short, long)])[0]
    return short, long, item


@pytest.fixture
def two_pairs(pair, make_trajectory):
    third = make_trajectory(2)
    second_item = QueueItem.objects.enqueue_comparisons(third.project, [(pair[0], third)])[0]
    return pair[2], second_item


# What the training page's and run page's tests launch from.


@pytest.fixture
def sft_snapshot(client, project, researcher, demonstrations):
    client.force_login(researcher)
    client.post(reverse("training-snapshot", args=[project.pk]), {"export_kind": "sft", "name": "demos"})
    return DatasetSnapshot.objects.get(name="demos")


@pytest.fixture
def reward_model(project, tiny_policy):
    run = TrainingRun.objects.create(project=project, kind="reward_model", status=RunStatus.SUCCEEDED)
    return RegisteredModel.objects.create(
        project=project, name="rm-1", kind="reward_model", path=str(tiny_policy.weights_path), run=run, base_model="/b"
    )
