from __future__ import annotations

from feedback_app.models import Critique
from tests.feedback_app.exports.helpers import decision, observation, prompt_until, rows, steps_of, turns_from
from tests.feedback_app.labels import stored_intervention


def intervene(annotator, trajectory, index, action, *, child=None, takeover=()):
    step = steps_of(trajectory)[index]
    return stored_intervention(
        annotator, step, action, step.reasoning, takeover_actions=list(takeover), child_trajectory=child
    )


def test_an_intervention_without_a_continuation_gives_the_prefix_and_the_correction(
    project, annotator, grid_trajectory
):
    parent = grid_trajectory(["up", "left", "down"])
    label = intervene(annotator, parent, 1, "right")

    [row] = rows(project, "sft")

    corrected = {"role": "assistant", "content": decision(steps_of(parent)[1])["content"].replace("left", "right")}
    assert row["messages"] == [*prompt_until(parent, 1), corrected]
    assert (row["source"], row["step_index"], row["label_ids"], row["trajectory_id"]) == (
        "intervention",
        1,
        [label.pk],
        parent.pk,
    )


def test_a_takeover_keeps_the_hand_played_steps_but_not_the_policys_continuation(project, annotator, grid_trajectory):
    parent = grid_trajectory(["up", "left", "down"])
    # Step 1 corrected to "right", step 2 played by hand ("right"), then the policy went on with "down".
    child = grid_trajectory(["up", "right", "right", "down"], parent=parent, branch_step_index=1)
    intervene(annotator, parent, 1, "right", child=child, takeover=["right"])

    [row] = rows(project, "sft")

    child_steps = steps_of(child)
    assert row["messages"] == [*prompt_until(child, 2), decision(child_steps[2])]
    assert row["source"] == "takeover"
    assert row["trajectory_id"] == child.pk


def test_human_demonstrations_are_whole_conversations(project, annotator, grid_trajectory):
    demonstration = grid_trajectory(["right", "right", "down"], source="human")
    grid_trajectory(["right"])  # a policy rollout: nothing to imitate

    [row] = rows(project, "sft")

    assert row["messages"] == prompt_until(demonstration, 0) + turns_from(demonstration, 0)
    assert (row["source"], row["annotator_ids"], row["step_index"]) == ("demonstration", [], None)
    assert rows(project, "sft", annotators=str(annotator.pk)) == []


def test_critiques_ask_about_the_trajectory_a_step_or_a_span(project, annotator, grid_trajectory):
    trajectory = grid_trajectory(["up", "left", "down"])
    steps = steps_of(trajectory)
    whole = Critique.objects.create(project=project, annotator=annotator, trajectory=trajectory, text="Never moved.")
    Critique.objects.create(
        project=project, annotator=annotator, trajectory=trajectory, step=steps[1], text="Left is a wall.", tags=["x"]
    )
    Critique.objects.create(
        project=project,
        annotator=annotator,
        trajectory=trajectory,
        step=steps[0],
        span_field="action",
        span_start=0,
        span_end=2,
        text="Up bumps the edge.",
    )

    exported = rows(project, "critiques")

    assert [row["step_index"] for row in exported] == [None, 1, 0]
    on_trajectory, on_step, on_span = (row["prompt"][0]["content"] for row in exported)
    assert on_trajectory.endswith("\n\nCritique this trajectory.")
    assert on_step.endswith(f"Assistant: {decision(steps[1])['content']}\n\nCritique the last step.")
    assert on_span.endswith('Critique this part of the last step\'s action: "up"')
    assert exported[0]["completion"] == [{"role": "assistant", "content": "Never moved."}]
    assert exported[0]["label_ids"] == [whole.pk]
    assert (exported[1]["tags"], exported[2]["span_text"]) == (["x"], "up")
    assert observation(steps[2])["content"] in on_trajectory
    [text] = rows(project, "critiques", style="text")[:1]
    assert text["completion"] == " Never moved."
