"""Trajectories stored before the turn contract get their messages: what their exports already wrote.

Each step's assistant message is the text the exports built for it (``reasoning ; action X``, or ``action X``, or
the tool calls as JSON for a step that acted only through them); its replies are the next step's observation as a
user message, and for the last step the final observation the rollout kept in the trajectory's metadata, if any.
A trajectory's prompt is its task's instruction as the system message and the first observation as the user's.
Interventions get the original and the corrected step as assistant messages the same way.
"""

import json

from django.db import migrations

BATCH = 500


def _decision(reasoning: str, action: str, tool_calls) -> str:
    if not action and tool_calls:
        action = json.dumps(tool_calls, ensure_ascii=False, sort_keys=True)
    reasoning = reasoning.strip()
    return f"{reasoning} ; action {action}" if reasoning else f"action {action}"


def backfill(apps, schema_editor):
    Trajectory = apps.get_model("feedback_app", "Trajectory")
    Step = apps.get_model("feedback_app", "Step")
    Intervention = apps.get_model("feedback_app", "Intervention")
    ids = list(Trajectory.objects.filter(prompt=[]).order_by("id").values_list("id", flat=True))
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        steps: dict[int, list] = {tid: [] for tid in chunk}
        for step in Step.objects.filter(trajectory_id__in=chunk).order_by("trajectory_id", "index"):
            steps[step.trajectory_id].append(step)
        changed_steps, changed_trajectories = [], []
        for trajectory in Trajectory.objects.filter(id__in=chunk).select_related("task"):
            own = steps[trajectory.id]
            trajectory.prompt = [{"role": "system", "content": trajectory.task.instruction}]
            if own:
                trajectory.prompt.append({"role": "user", "content": own[0].observation})
            changed_trajectories.append(trajectory)
            final = (trajectory.metadata or {}).get("final_observation")
            for position, step in enumerate(own):
                step.message = {
                    "role": "assistant",
                    "content": _decision(step.reasoning, step.action, step.tool_calls),
                }
                if position + 1 < len(own):
                    step.replies = [{"role": "user", "content": own[position + 1].observation}]
                elif isinstance(final, str) and final:
                    step.replies = [{"role": "user", "content": final}]
                changed_steps.append(step)
        Trajectory.objects.bulk_update(changed_trajectories, ["prompt"])
        Step.objects.bulk_update(changed_steps, ["message", "replies"], batch_size=BATCH)
    for intervention in Intervention.objects.filter(corrected_message={}).iterator(chunk_size=BATCH):
        intervention.original_message = {
            "role": "assistant",
            "content": _decision(intervention.original_reasoning, intervention.original_action, None),
        }
        intervention.corrected_message = {
            "role": "assistant",
            "content": _decision(intervention.corrected_reasoning, intervention.corrected_action, None),
        }
        intervention.save(update_fields=["original_message", "corrected_message"])


class Migration(migrations.Migration):
    dependencies = [
        ("feedback_app", "0009_turn_contract"),
    ]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
