"""Trajectories made by actually playing the project's gridworld, so observations, renders and legal actions are real
(the step-label and intervene tests replay them in the environment)."""

from __future__ import annotations

from feedback_app.models import PolicyVersion, Step, Task, Trajectory
from tests.trajectories import save_steps

# Task seed 7 of the default 7×7 gridworld: the agent starts at row 3, column 1 and the goal is two rows up, five
# columns right. "down" at step 3 is the first wrong move; the rest still reaches the goal.
SEED_7_ACTIONS = ["right", "right", "down", "right", "right", "up", "up", "right"]
FIRST_WRONG_INDEX = 2


def play_gridworld(task: Task, policy_version: PolicyVersion | None, actions: list[str]) -> Trajectory:
    """Play `actions` in the task's project environment and store the episode with its hidden outcome."""
    project = task.project
    env = project.environment.load()
    observation = env.reset(task.spec)
    steps, total = [], 0.0
    for index, action in enumerate(actions):
        result = env.step(action)
        steps.append(
            Step(
                index=index,
                observation=observation,
                reasoning=f"The goal is up and to the right of me, so I move {action} this turn.",
                action=action,
                env_reward=result.reward,
                render=env.render(observation),
                done=result.done,
            )
        )
        observation, total = result.observation, total + result.reward
        if result.done:
            break
    oracle = env.oracle(task.spec)
    played = [step.action for step in steps]
    trajectory = Trajectory.objects.create(
        project=project,
        task=task,
        policy_version=policy_version,
        source="policy" if policy_version is not None else "human",
        num_steps=len(steps),
        total_env_reward=total,
        success=oracle.success(played),
        outcome_return=oracle.true_return(played),
        oracle={"step_correct": oracle.step_correct(played), "secret_marker": "oracle-secret"},
        metadata={"final_observation": observation},
    )
    save_steps(trajectory, steps)
    return trajectory
