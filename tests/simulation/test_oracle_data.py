"""The oracle-labelled gridworld rows that the judge pipelines train and are evaluated on."""

from __future__ import annotations

import json

from reward_models.envs.gridworld import GridWorld
from reward_models.policy.turns import transcript
from simulation.episodes import scripted_episodes
from simulation.oracle_data import (
    critique_rows,
    intervention_rows,
    intervention_step_preference_rows,
    preference_rows,
    returns_rows,
    stepwise_rows,
    unpaired_rows,
    write_jsonl,
)

LAYOUT = ["A . . .", ". # # .", ". . . G", ". . . ."]


def test_progress_return_orders_successes_by_length_and_failures_by_distance():
    oracle = GridWorld(max_steps=10).oracle({"layout": [row.replace(" ", "") for row in LAYOUT]})
    short = ["down", "down", "right", "right", "right"]
    long = ["up", *short]
    near_failure = ["down", "down", "right", "right", "left", "right", "left", "right", "left", "right"]
    far_failure = ["up"] * 10
    scores = [oracle.progress_return(actions) for actions in (short, long, near_failure, far_failure)]
    assert scores == sorted(scores, reverse=True)
    assert scores[1] > 1.0 > 0.5 > scores[2]
    assert scores[3] == 0.0  # never moved: no progress at all


def test_a_rational_teacher_always_prefers_the_oracle_better_trajectory_and_a_contrary_one_never():
    episodes = scripted_episodes(20, per_task=3, seed=1)
    rational = preference_rows(episodes)
    contrary = preference_rows(episodes, epsilon=1.0)
    assert rational and all(row["oracle_preferred"] for row in rational)
    assert not any(row["oracle_preferred"] for row in contrary)
    assert {row["pair_type"] for row in rational} == {"both_succeeded", "one_succeeded", "both_failed"}


def test_ties_are_dropped_or_kept_as_tie_rows():
    episodes = scripted_episodes(20, per_task=3, seed=2)
    dropped = preference_rows(episodes, equal_threshold=0.05)
    kept = preference_rows(episodes, equal_threshold=0.05, ties="include")
    ties = [row for row in kept if row["tie"]]
    assert ties and len(kept) == len(dropped) + len(ties)
    assert all(row["margin"] == 0.0 for row in ties)


def test_text_rows_are_the_transcript_cut_where_the_answer_starts():
    episodes = scripted_episodes(1, per_task=2, seed=3)
    row = preference_rows(episodes, style="text", ties="include")[0]
    by_id = {episode.trajectory_id: transcript(episode.messages) for episode in episodes}
    assert row["prompt"].endswith("\nAssistant:")
    assert row["prompt"] + row["chosen"] == by_id[row["chosen_trajectory_id"]]
    assert row["prompt"] + row["rejected"] == by_id[row["rejected_trajectory_id"]]


def test_step_labels_follow_the_oracle_and_interventions_reject_the_first_wrong_step():
    episodes = scripted_episodes(10, per_task=2, noises=(0.6,), seed=4)
    rows = stepwise_rows(episodes)
    assert [row["labels"] for row in rows] == [episode.step_correct for episode in episodes]
    for row, episode in zip(rows, episodes, strict=True):
        # Each piece ends at a step's assistant message: the prompt and the pieces are the conversation without
        # the final observation, which no step is judged on.
        assert all(piece[-1]["role"] == "assistant" for piece in row["completions"])
        assert row["prompt"] + [m for piece in row["completions"] for m in piece] == episode.messages[:-1]
        assert row["prompt"] == episode.prompt and row["tools"] == []
    for row, episode in zip(stepwise_rows(episodes, style="text"), episodes, strict=True):
        assert row["prompt"] + "".join(row["completions"]) == transcript(episode.messages[:-1])
    flipped = stepwise_rows(episodes, epsilon=1.0)
    assert all(row["labels"] == [not label for label in row["oracle_labels"]] for row in flipped)
    for row in intervention_rows(episodes):
        assert row["source"] == "intervention"
        assert row["labels"][-1] is False and all(row["labels"][:-1])


def test_returns_and_critiques_rows_round_trip_through_jsonl(tmp_path):
    episodes = scripted_episodes(5, per_task=2, seed=5)
    returns = returns_rows(episodes)
    assert [sum(row["rewards"]) for row in returns] == [float(episode.success) for episode in episodes]
    assert all(row["rewards"] is None for row in returns_rows(episodes, with_rewards=False))
    critiques = critique_rows(episodes)
    wrong = [episode for episode in episodes if episode.first_error is not None]
    assert wrong, "noisy episodes should contain a wrong step"
    by_id = {row["trajectory_id"]: row for row in critiques}
    for episode in wrong:
        assert f"step {episode.first_error + 1} is wrong" in by_id[episode.trajectory_id]["completion"][0]["content"]
    path = write_jsonl(critiques, tmp_path / "critiques.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == critiques


def test_an_episode_keeps_the_observation_its_last_action_led_to():
    env = GridWorld()
    for episode in scripted_episodes(6, per_task=2, seed=3):
        observation = env.reset(env.make_task(episode.task_id))
        for action in episode.actions:
            observation = env.step(action).observation
        assert episode.final_observation == observation
        # The conversation ends with it, as an exported trajectory's does.
        assert episode.messages[-1] == {"role": "user", "content": observation}


def test_rows_are_cut_from_the_conversation_where_the_exports_cut_it():
    episodes = scripted_episodes(4, per_task=2, noises=(0.6,), seed=6)
    for row in preference_rows(episodes, ties="include"):
        assert [message["role"] for message in row["prompt"]] == ["system", "user"]
        assert row["chosen"][0]["role"] == "assistant" and row["chosen"][-1]["role"] == "user"
        assert row["tools"] == []
    steps = intervention_step_preference_rows(episodes)
    assert steps
    for row in steps:
        episode = next(e for e in episodes if e.trajectory_id == row["rejected_trajectory_id"])
        assert row["prompt"] == episode.conversation.before_step(row["step_index"])
        assert row["rejected"] == [episode.conversation.assistant(row["step_index"])]
        assert [message["role"] for message in row["chosen"]] == ["assistant"]
    for row in unpaired_rows(episodes):
        assert row["prompt"] + row["completion"] == next(
            e.messages for e in episodes if e.trajectory_id == row["trajectory_id"]
        )
    conversational = returns_rows(episodes, style="conversational")
    assert all(len(row["completions"]) == len(row["rewards"]) for row in conversational)
