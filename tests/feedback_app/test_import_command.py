from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from feedback_app.models import PolicyVersion, Step, Task, Trajectory
from tests.feedback_app.import_rows import as_json_lines, import_row

pytestmark = pytest.mark.django_db


def _row(external_id: str = "ep-1", **overrides) -> dict:
    """An import row whose last step also carries a reward and a screenshot (a row with media, which the serializer
    reads rather than the fast path)."""
    last_step = {
        "observation": "3 results",
        "action": "",
        "tool_calls": [{"name": "book", "arguments": {"flight": "SK123"}}],
        "reward": 1.0,
        "media": [{"type": "image", "url": "https://example.test/shot.png"}],
    }
    return import_row(external_id, last_step=last_step, **overrides)


def _write(tmp_path, rows: list, name: str = "trajectories.jsonl"):
    path = tmp_path / name
    path.write_bytes(as_json_lines(rows))
    return path


def test_it_imports_steps_and_chat_style_rows(project, tmp_path):
    chat = {
        "external_id": "chat-1",
        "task": {"external_id": "task-2"},
        "messages": [
            {"role": "system", "content": "You are a shopping agent. Buy milk."},
            {"role": "user", "content": "Start."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "milk"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "2 results"},
            {"role": "assistant", "content": "buy result 1", "reasoning_content": "cheapest"},
        ],
    }
    call_command("import_trajectories", project.slug, str(_write(tmp_path, [_row(), chat])))

    imported = Trajectory.objects.get(external_id="ep-1")
    assert (imported.source, imported.num_steps, imported.success, imported.outcome_return) == ("import", 2, True, 1.0)
    assert imported.policy_version.name == "my-agent-v3" and imported.policy_version.kind == "external"
    last = imported.steps.get(index=1)
    book = {"name": "book", "arguments": '{"flight": "SK123"}'}
    assert last.tool_calls == [{"id": "call_0", "type": "function", "function": book}]
    assert last.done and last.media[0]["type"] == "image"

    chat_trajectory = Trajectory.objects.get(external_id="chat-1")
    assert chat_trajectory.task.instruction == "You are a shopping agent. Buy milk."
    steps = list(chat_trajectory.steps.order_by("index"))
    assert [s.observation for s in steps] == ["Start.", "2 results"]
    assert steps[0].tool_calls[0]["function"]["name"] == "search"
    # Verbatim: the stored turns are the imported messages.
    assert [s.message for s in steps] == [chat["messages"][2], chat["messages"][4]]
    assert steps[0].replies == [chat["messages"][3]] and chat_trajectory.prompt == chat["messages"][:2]
    assert (steps[1].action, steps[1].reasoning) == ("buy result 1", "cheapest")


def test_a_retried_import_duplicates_nothing(project, tmp_path):
    path = _write(tmp_path, [_row("ep-1"), _row("ep-2")])
    call_command("import_trajectories", project.slug, str(path))
    call_command("import_trajectories", str(project.pk), str(path))
    assert Trajectory.objects.filter(project=project).count() == 2
    assert Task.objects.filter(project=project, external_id="task-1").count() == 1
    assert PolicyVersion.objects.filter(project=project, name="my-agent-v3").count() == 1


def test_one_bad_row_rejects_the_whole_file_with_row_numbers(project, tmp_path):
    bad_step = _row("ep-2", steps=[{"observation": "x", "reward": "lots", "action": "go"}])
    no_steps = _row("ep-3", steps=[])
    path = _write(tmp_path, [_row("ep-1"), bad_step, "{not json", no_steps, _row("ep-1")])
    with pytest.raises(CommandError) as excinfo:
        call_command("import_trajectories", project.slug, str(path))
    message = str(excinfo.value)
    assert "4 bad row(s); nothing was imported" in message
    assert "row 2: steps[0].reward: A valid number is required." in message
    assert "row 3: (line): malformed JSON" in message
    assert "row 4: steps: A trajectory needs at least one step." in message
    assert "row 5: external_id: repeats row 1's 'ep-1'" in message
    assert Trajectory.objects.count() == 0 and Step.objects.count() == 0 and Task.objects.count() == 0


def test_it_names_the_missing_project(tmp_path, db):
    with pytest.raises(CommandError, match="project: no project with id or slug 'nope'"):
        call_command("import_trajectories", "nope", str(_write(tmp_path, [_row()])))


def test_a_json_array_body_imports_too(project, tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([_row("a"), _row("b")]))
    call_command("import_trajectories", project.slug, str(path))
    assert set(Trajectory.objects.values_list("external_id", flat=True)) == {"a", "b"}
