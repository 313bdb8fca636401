"""Conversations for exports are the stored turns, verbatim: on either database the messages come back exactly as
they were stored, awkward text and tool calls included, and every slice's JSON is the compact encoding of it."""

from __future__ import annotations

import pytest

from feedback_app.exports.conversation import Conversation, encode_json, fetch_conversations
from reward_models.conversation import StepTurn
from reward_models.rows import shared_steps

pytestmark = pytest.mark.django_db

# Every character below U+0080 but NUL (PostgreSQL text cannot hold it), and some that JSON encoders treat apart.
AWKWARD = "".join(map(chr, range(1, 128))) + "\u2028\u2029\ufeff\u00a0é漢字😀\\u0041\"'"
CALL = {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": '{"q": "é"}'}}


def _store(project, policy, prompt: list[dict], turns: list[tuple[dict, list[dict], float]], tools=()):
    from feedback_app.models import Step, Task, Trajectory

    task = Task.objects.create(project=project, instruction="x")
    trajectory = Trajectory.objects.create(
        project=project,
        task=task,
        policy_version=policy,
        source="import",
        num_steps=len(turns),
        prompt=prompt,
        tools=list(tools),
    )
    Step.objects.bulk_create(
        Step(trajectory=trajectory, index=i, message=message, replies=replies, env_reward=reward)
        for i, (message, replies, reward) in enumerate(turns)
    )
    return trajectory


def test_fetched_conversations_are_the_stored_turns_verbatim(project, external_policy):
    prompt = [{"role": "system", "content": AWKWARD}, {"role": "user", "content": " buy a mug \n"}]
    calling = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    replies = [{"role": "tool", "tool_call_id": "call_0", "name": "search", "content": AWKWARD}]
    answer = {"role": "assistant", "content": "  done. "}
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    shop = _store(project, external_policy, prompt, [(calling, replies, 0.5), (answer, [], -1.25)], tools)
    empty = _store(project, None, [{"role": "user", "content": "nothing yet"}], [])

    fetched = fetch_conversations([shop.pk, empty.pk], rewards=True)

    conversation = fetched[shop.pk]
    assert conversation.messages == [*prompt, calling, *replies, answer]
    assert (conversation.prompt_length, conversation.step_starts, conversation.num_steps) == (2, [2, 4], 2)
    assert conversation.tools == tools and conversation.rewards == [0.5, -1.25]
    for start, stop in [(0, None), (0, 2), (2, None), (2, 4), (4, 5)]:
        assert conversation.json(start, stop) == encode_json(conversation.messages[start:stop])
    assert fetched[empty.pk].messages == [{"role": "user", "content": "nothing yet"}]
    assert fetched[empty.pk].num_steps == 0


def test_the_worker_reads_the_same_messages_from_the_model_however_many_queries_it_takes(
    project, external_policy, monkeypatch
):
    from feedback_app.models import Trajectory, trajectories

    calling = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    replies = [{"role": "tool", "tool_call_id": "call_0", "name": "search", "content": AWKWARD}]
    stored = [
        _store(project, external_policy, [{"role": "user", "content": f"task {n}"}], [(calling, replies, 0.0)] * n)
        for n in range(5)
    ]
    ids = [t.pk for t in reversed(stored)] + [stored[0].pk]
    monkeypatch.setattr(trajectories, "CONVERSATIONS_PER_QUERY", 2)

    read = Trajectory.objects.conversations(ids)

    assert sorted(read) == sorted(t.pk for t in stored)  # each once, across three queries
    assert read == {pk: conversation.messages for pk, conversation in fetch_conversations(ids).items()}
    assert read[stored[4].pk] == [{"role": "user", "content": "task 4"}, *[calling, *replies] * 4]


def test_shared_steps_count_the_turns_two_branches_agree_on():
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "o0"}]

    def turn(text: str, observation: str) -> StepTurn:
        return StepTurn({"role": "assistant", "content": text}, [{"role": "user", "content": observation}])

    base = Conversation(1, 1, None, prompt, [turn("a", "o1"), turn("b", "o2"), turn("c", "o3")])
    branch = Conversation(2, 1, None, prompt, [turn("a", "o1"), turn("B", "o2'")])
    other_start = Conversation(3, 1, None, [prompt[0], {"role": "user", "content": "elsewhere"}], [turn("a", "o")])
    assert shared_steps(base, branch) == 1  # both act at step 1 after the same step 0
    assert shared_steps(base, base) == 2
    assert shared_steps(base, other_start) is None
    assert base.shared_prompt(other_start) == 1
