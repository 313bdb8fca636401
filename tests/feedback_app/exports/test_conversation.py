"""Conversations for exports: on PostgreSQL the database writes each message's JSON, and it must be exactly what the
Python path writes, byte for byte (snapshots are re-downloaded and hashed)."""

from __future__ import annotations

import json

import pytest

from feedback_app.exports.conversation import Conversation, build_messages, encode_json

pytestmark = pytest.mark.django_db

# Every character below U+0080 but NUL (PostgreSQL text cannot hold it), and some that JSON encoders treat apart.
AWKWARD = "".join(map(chr, range(1, 128))) + "\u2028\u2029\ufeff\u00a0é漢字😀\\u0041\"'"
# Unicode whitespace that Python's str.strip() removes and a plain trim would not.
UNICODE_SPACE = "\u3000\u2003\x1c\x85\u00a0\t\n "


def store(project, policy, instruction: str, steps: list[dict]):
    from feedback_app.models import Step, Task, Trajectory

    task = Task.objects.create(project=project, instruction=instruction)
    trajectory = Trajectory.objects.create(
        project=project, task=task, policy_version=policy, source="import", num_steps=len(steps)
    )
    Step.objects.bulk_create(Step(trajectory=trajectory, index=i, **step) for i, step in enumerate(steps))
    return trajectory


def test_postgresql_writes_each_message_as_the_python_path_does(project, external_policy):
    from django.db import connection

    from feedback_app.exports.conversation import _built_conversations, fetch_conversations

    if connection.vendor != "postgresql":
        pytest.skip("the database writes the JSON only on PostgreSQL; SQLite always takes the Python path")
    awkward = store(
        project,
        external_policy,
        AWKWARD,
        [
            {
                "observation": AWKWARD,
                "reasoning": UNICODE_SPACE + AWKWARD + UNICODE_SPACE,
                "action": "up",
                "env_reward": 0.5,
            },
            {"observation": "", "reasoning": UNICODE_SPACE, "action": AWKWARD},  # reasoning that strips to nothing
            {"observation": "o", "reasoning": "", "action": "", "env_reward": -1.25},  # nothing at all
        ],
    )
    tool_only = store(
        project,
        external_policy,
        "use a tool",
        [
            {
                "observation": "o",
                "reasoning": "r",
                "action": "",
                "tool_calls": [{"name": "search", "args": {"q": "é"}}],
            },
            {"observation": "o2", "reasoning": "r2", "action": "done", "tool_calls": [{"name": "x"}]},
        ],
    )
    empty = store(project, None, "no steps yet", [])
    ids = [awkward.pk, tool_only.pk, empty.pk]

    fetched = fetch_conversations(ids, rewards=True)
    built = _built_conversations(ids, True)

    assert fetched.keys() == built.keys() == set(ids)
    # The database wrote these two; the tool-call step needs Python's json.dumps, so that trajectory is built.
    assert fetched[awkward.pk]._message_json is not None and fetched[empty.pk]._message_json is not None
    assert fetched[tool_only.pk]._messages is not None
    for trajectory_id in ids:
        ours, python = fetched[trajectory_id], built[trajectory_id]
        assert (ours.task_id, ours.policy_version_id, ours.num_steps, ours.rewards) == (
            python.task_id,
            python.policy_version_id,
            python.num_steps,
            python.rewards,
        )
        for start, stop in [(0, None), (0, 1), (0, 2), (1, None), (2, None)]:
            assert ours.json(start, stop) == python.json(start, stop) == encode_json(python.messages[start:stop])
        assert ours.messages == python.messages
    assert fetched[awkward.pk].rewards == [0.5, 0.0, -1.25]
    assert fetched[awkward.pk].messages[2]["content"] == AWKWARD + " ; action up"  # stripped as str.strip() does
    assert fetched[awkward.pk].messages[4]["content"] == "action " + AWKWARD
    assert fetched[empty.pk].messages == [{"role": "system", "content": "no steps yet"}]


def test_a_conversation_made_from_message_json_reads_as_one_made_from_messages():
    first = build_messages(AWKWARD, [("obs", " why ", "up", None), ("obs 2", "", "left", None)])
    other = build_messages(AWKWARD, [("obs", "", "down", None)])
    elsewhere = build_messages(AWKWARD, [("another start", "", "down", None)])

    def from_json(messages):
        return Conversation(1, 2, 3, message_json=[encode_json(message) for message in messages])

    for messages in (first, other):
        decoded, plain = from_json(messages), Conversation(1, 2, 3, messages)
        assert decoded.num_steps == plain.num_steps == (len(messages) - 1) // 2
        assert decoded.json(0, 2) == plain.json(0, 2) and decoded.json(2) == plain.json(2)
        assert decoded.turns(2) == plain.turns(2) == messages[2:]
        assert json.loads(decoded.json(0)) == decoded.messages == messages
    assert from_json(first).opens_like(from_json(other)) and from_json(first).opens_like(Conversation(9, 2, 3, other))
    assert not from_json(first).opens_like(from_json(elsewhere))
    assert not from_json(first).opens_like(from_json(first[:1]))  # no first observation to share
    with pytest.raises(ValueError, match="messages or from their JSON"):
        Conversation(1, 2, 3, first, message_json=[])


def test_the_whitespace_the_sql_strips_is_what_str_strip_removes():
    from feedback_app.exports.conversation import PYTHON_WHITESPACE

    assert PYTHON_WHITESPACE == "".join(character for character in map(chr, range(0x110000)) if character.isspace())
