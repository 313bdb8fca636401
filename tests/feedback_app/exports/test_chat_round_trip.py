"""Chat trajectories with tool calls come back out of every export exactly as they went in.

OpenAI-format transcripts (system, user, assistant with tool calls, parallel calls, tool results) are imported
through the API, labelled (a comparison, step labels, a rating, a critique and an intervention that edits a tool
call), and the `preference`, `stepwise`, `unpaired` and `sft` exports give back the imported messages, byte for byte
as JSON text, plus the corrected turn where there is one; every conversational row carries the tools. A rollout of a
local chat model exports each assistant turn as the decoded text of the tokens it generated.
"""

from __future__ import annotations

import json

import pytest

from feedback_app.models import Comparison, Critique, EnvironmentSpec, Membership, Project, Rating, StepLabel
from reward_models.envs.toolshop_tools import TOOLS

pytestmark = pytest.mark.django_db

AWKWARD = 'quote " backslash \\ newline \n tab \t accents é 中文 emoji 🙂  trailing space '


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _transcript(variant: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a shopping assistant. " + AWKWARD},
        {"role": "user", "content": 'Buy "red mug", quantity 2.'},
        {
            "role": "assistant",
            "content": f"Let me look that up ({variant}).",
            "tool_calls": [
                _call("call_a", "search", '{"query": "red mug"}'),
                _call("call_b", "view_cart", "{}"),  # parallel calls
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "name": "search", "content": '[{"name": "red mug", "id": "kq48"}]'},
        {"role": "tool", "tool_call_id": "call_b", "name": "view_cart", "content": '{"items": [], "total": 0}'},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_c", "add_to_cart", variant)]},
        {"role": "tool", "tool_call_id": "call_c", "name": "add_to_cart", "content": AWKWARD},
        {"role": "assistant", "content": f"Done: {AWKWARD}"},
    ]


def _same(first: list[dict], second: list[dict]) -> bool:
    """Message for message, the same JSON text (keys in any order, every string exactly)."""
    return [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in first] == [
        json.dumps(m, sort_keys=True, ensure_ascii=False) for m in second
    ]


@pytest.fixture
def shop_project(researcher, annotator):
    spec = EnvironmentSpec.objects.create(
        name="toolshop-test", dotted_path="reward_models.envs.toolshop.ToolShop", config={}
    )
    project = Project.objects.create(name="Shop", environment=spec)
    for user, role in ((researcher, "researcher"), (annotator, "annotator")):
        Membership.objects.create(user=user, project=project, role=role)
    return project


def _export(client, project, kind: str, **query) -> list[dict]:
    response = client.get(f"/api/projects/{project.pk}/exports/{kind}", query)
    assert response.status_code == 200, response.content
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


def test_imported_tool_calls_round_trip_through_every_export(api_as, shop_project, researcher, annotator):
    good = _transcript('{"item_id": "kq48", "quantity": 2}')
    bad = _transcript('{"item_id": "kq48", "quantity": 9}')
    rows = [
        {"external_id": name, "task": {"seed": 3, "external_id": "shop-3"}, "messages": messages, "tools": TOOLS}
        for name, messages in (("good", good), ("bad", bad))
    ]
    client = api_as(researcher)
    imported = client.post(
        f"/api/projects/{shop_project.pk}/trajectories/import", json.dumps(rows), content_type="application/json"
    )
    assert imported.status_code == 200, imported.json()
    first, second = shop_project.trajectories.order_by("external_id")  # "bad", then "good"
    bad_trajectory, good_trajectory = first, second

    a, b = sorted((good_trajectory, bad_trajectory), key=lambda t: t.pk)
    Comparison.objects.create(
        project=shop_project,
        annotator=annotator,
        trajectory_a=a,
        trajectory_b=b,
        choice="a" if a == good_trajectory else "b",
    )
    for step in good_trajectory.steps.all():
        StepLabel.objects.create(project=shop_project, annotator=annotator, step=step, value=1)
    Rating.objects.create(project=shop_project, annotator=annotator, trajectory=good_trajectory, thumb_up=True)
    Critique.objects.create(project=shop_project, annotator=annotator, trajectory=bad_trajectory, text="too many")
    corrected = {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("call_c", "add_to_cart", good[5]["tool_calls"][0]["function"]["arguments"])],
    }
    intervened = api_as(annotator).post(
        f"/api/projects/{shop_project.pk}/interventions/",
        {
            "trajectory": bad_trajectory.pk,
            "step": bad_trajectory.steps.get(index=1).pk,
            "corrected_message": corrected,
        },
        format="json",
    )
    assert intervened.status_code == 201, intervened.json()

    [preference] = _export(client, shop_project, "preference")
    assert _same(preference["prompt"] + preference["chosen"], good)
    assert _same(preference["prompt"] + preference["rejected"], bad)
    assert preference["tools"] == TOOLS

    [stepwise] = [row for row in _export(client, shop_project, "stepwise") if row["source"] == "label"]
    assert _same(stepwise["prompt"] + [m for piece in stepwise["completions"] for m in piece], good)
    assert stepwise["labels"] == [True, True, True] and stepwise["tools"] == TOOLS

    [unpaired] = _export(client, shop_project, "unpaired")
    assert _same(unpaired["prompt"] + unpaired["completion"], good) and unpaired["label"] is True

    [sft] = _export(client, shop_project, "sft")
    assert _same(sft["messages"], [*bad[:5], corrected])
    assert sft["tools"] == TOOLS

    [step_preference] = _export(client, shop_project, "step_preference")
    assert _same(step_preference["prompt"], bad[:5])
    assert _same(step_preference["chosen"], [corrected]) and _same(step_preference["rejected"], [bad[5]])


def test_an_edited_tool_call_that_breaks_its_schema_is_a_400_naming_the_field(
    api_as, shop_project, researcher, annotator
):
    rows = [{"external_id": "t", "task": {"seed": 3}, "messages": _transcript('{"item_id": "kq48", "quantity": 2}')}]
    api_as(researcher).post(
        f"/api/projects/{shop_project.pk}/trajectories/import", json.dumps(rows), content_type="application/json"
    )
    trajectory = shop_project.trajectories.get()
    step = trajectory.steps.get(index=1)
    url = f"/api/projects/{shop_project.pk}/interventions/"
    for arguments, field in (
        ('{"item_id": "kq48", "quantity": 0}', "tool_calls.0.arguments.quantity"),
        ('{"item_id": "kq48"', "tool_calls.0.arguments"),
        ('{"item_id": 5, "quantity": 1}', "tool_calls.0.arguments.item_id"),
    ):
        message = {"role": "assistant", "content": "", "tool_calls": [_call("c", "add_to_cart", arguments)]}
        response = api_as(annotator).post(
            url, {"trajectory": trajectory.pk, "step": step.pk, "corrected_message": message}, format="json"
        )
        assert response.status_code == 400, response.json()
        assert field in response.json(), response.json()
    unknown = {"role": "assistant", "content": "", "tool_calls": [_call("c", "teleport", "{}")]}
    response = api_as(annotator).post(
        url, {"trajectory": trajectory.pk, "step": step.pk, "corrected_message": unknown}, format="json"
    )
    assert response.status_code == 400 and "tool_calls.0.name" in response.json()
    assert not trajectory.interventions.exists()


def test_a_rollout_exports_each_turn_as_the_decoded_generated_tokens(shop_project, researcher, tmp_path):
    from feedback_app.exports import ExportFilters, ExportKind, export_rows
    from feedback_app.models import PolicyVersion, Task, TrainingRun
    from reward_models.envs.toolshop import ToolShop
    from reward_models.policy.chat_format import build_bpe_tokenizer
    from reward_models.policy.local import LocalCausalLMPolicy
    from reward_models.policy.model import build_tiny_llama, save_policy
    from reward_models.rollout import rollout
    from training.rollouts import store_episodes

    env = ToolShop()
    tokenizer = build_bpe_tokenizer([json.dumps(TOOLS)] + [env.make_task(seed)["instruction"] for seed in range(50)])
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    path = save_policy(model, tokenizer, tmp_path / "chat", history_window=None, max_new_tokens=24)
    policy = LocalCausalLMPolicy(path)
    tasks = [
        Task.objects.create(project=shop_project, seed=seed, spec=env.make_task(seed), instruction="x")
        for seed in (1, 2)
    ]
    episodes = rollout(ToolShop, [task.spec for task in tasks], policy, greedy=False, seed=3, max_turns=3)
    version = PolicyVersion.objects.create(project=shop_project, name="tiny", kind="local", weights_path=str(path))
    run = TrainingRun.objects.create(project=shop_project, kind="rollout", base_policy=version, config={})
    trajectories = store_episodes(run, tasks, episodes, generation={})
    for trajectory in trajectories:
        trajectory.source = "human"  # a demonstration: the sft export's whole-trajectory rows
        trajectory.save(update_fields=["source"])

    exported = [row.values for row in export_rows(shop_project, ExportKind.SFT, ExportFilters())]
    assert len(exported) == 2
    for row, trajectory in zip(exported, trajectories, strict=True):
        assistant = [message for message in row["messages"] if message["role"] == "assistant"]
        steps = list(trajectory.steps.order_by("index"))
        assert len(assistant) == len(steps) > 0
        for message, step in zip(assistant, steps, strict=True):
            assert message["content"] == policy.tokenizer.decode(step.token_ids, skip_special_tokens=True)
        assert row["tools"] == TOOLS
