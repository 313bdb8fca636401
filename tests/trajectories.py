"""Storing test trajectories the way imports store Tandem's step rows: each step's verbatim turn (its assistant
message and the reply that came back) is filled in from its observation, reasoning and action."""

from __future__ import annotations

from collections.abc import Sequence


def save_steps(trajectory, steps: Sequence) -> list:
    """Give unsaved `Step`s (index, observation, reasoning, action and tool_calls set) their turns, store them,
    and store the trajectory's prompt; returns the steps."""
    from feedback_app.models import Step
    from feedback_app.trajectory_schema import turns_for_steps

    rows = [
        {"observation": s.observation, "reasoning": s.reasoning, "action": s.action, "tool_calls": s.tool_calls}
        for s in steps
    ]
    if rows:
        trajectory.prompt = turns_for_steps(trajectory.task.instruction, rows)
        trajectory.save(update_fields=["prompt"])
    for step, row in zip(steps, rows, strict=True):
        step.trajectory = trajectory
        step.message, step.replies, step.tool_calls = row["message"], row["replies"], row["tool_calls"]
    return Step.objects.bulk_create(steps)


def correction(step, action: str, reasoning: str = "") -> dict:
    """The verbatim fields of an intervention on `step` by a gridworld move: the step's assistant message as stored
    and the correction written the way gridworld policies write their turns."""
    from reward_models.envs.gridworld import GridWorld

    return {
        "original_message": step.message,
        "corrected_message": GridWorld().message_for_action(action, reasoning),
        "original_reasoning": step.reasoning,
        "original_action": step.action,
        "corrected_reasoning": reasoning,
        "corrected_action": action,
    }
