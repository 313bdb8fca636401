"""The training rows every export kind writes, built from conversations and plain values: the one row contract.

Tandem's exports (`feedback_app.exports`) build their rows here from the labels they read, and the simulated data
that tests and benches train on is built here too, so a pipeline trained on either reads the same layout. A row is
a dict whose keys are its columns, in the order they are written; the columns of each kind are listed in
`feedback_app.exports.schemas`.

Two things make a row: where it cuts a trajectory's conversation (`reward_models.conversation`), and the judgement
that labels the cut. The cuts:

- preference and unpaired rows split a conversation after its prompt (`split_pair`, `split_at`);
- step_preference rows before a step's assistant message, with two continuations from there;
- stepwise and returns rows after each step's assistant message (`step_pieces`), an unlabelled step merged into
  the next labelled one (`labelled_pieces`);
- sft rows keep whole messages; critique rows show a transcript and ask for a critique (`critique_pair`).

A row is conversational (message lists, and a ``tools`` column with the tool schemas the agent was offered) or text
(the same turns as one ``Role: content`` transcript string each, `reward_models.policy.turns.text_pair`, and no
``tools``: a text row has no chat template to give them to). The row builders take ``tools=None`` for a text row.

No Django, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from reward_models.conversation import Message
from reward_models.policy.turns import text_pair, text_steps, transcript

CONVERSATIONAL = "conversational"
TEXT = "text"
STYLES = (CONVERSATIONAL, TEXT)

# Comparison strength (1 slight, 2 clear, 3 decisive) as the reward-model margin: the loss asks for
# r(chosen) - r(rejected) > margin, so a slight preference asks for no gap and a decisive one for a gap of 1.
MARGIN_BY_STRENGTH = {1: 0.0, 2: 0.5, 3: 1.0}
# A correction is the clearest judgement an annotator gives: the original step was bad enough to rewrite.
INTERVENTION_MARGIN = 1.0


class ConversationLike(Protocol):
    """What the cuts read of a conversation: `reward_models.conversation.Conversation`, or the exports' own."""

    messages: list[Message]
    prompt_length: int
    step_starts: list[int]

    @property
    def num_steps(self) -> int: ...


# --- cuts ----------------------------------------------------------------------------------------------------------


def check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"style must be 'conversational' or 'text', got {style!r}")


def styled(style: str, prompt: list[Message], *completions: list[Message]) -> tuple:
    """``(prompt, *completions)`` as they are (conversational), or as text: the prompt's transcript (ending where
    the assistant's answer starts) and each completion's transcript after it."""
    if style == CONVERSATIONAL:
        return (prompt, *completions)
    texts = [text_pair(prompt, completion) for completion in completions]
    return (texts[0][0], *(completion for _, completion in texts))


def split_at(messages: list[Message], cut: int, style: str) -> tuple[Any, Any]:
    """(prompt, completion): a conversation split at position `cut`."""
    return styled(style, messages[:cut], messages[cut:])


def split_pair(chosen: list[Message], rejected: list[Message], cut: int, style: str) -> tuple[Any, Any, Any]:
    """(prompt, chosen, rejected): two conversations that share their first `cut` messages, split there."""
    return styled(style, chosen[:cut], chosen[cut:], rejected[cut:])


def shared_steps(a: ConversationLike, b: ConversationLike) -> int | None:
    """The most steps ``k`` two trajectories share such that both agree on everything before step ``k``'s assistant
    message and both go on with a turn there: that common prefix can be a prompt. None when even their prompts
    differ."""
    if a.prompt_length != b.prompt_length or a.messages[: a.prompt_length] != b.messages[: b.prompt_length]:
        return None
    shared = None
    step = 0
    while step < a.num_steps and step < b.num_steps:
        start = a.step_starts[step]
        if start != b.step_starts[step] or a.messages[a.prompt_length : start] != b.messages[b.prompt_length : start]:
            break
        shared = step
        step += 1
    return shared


def step_pieces(conversation: ConversationLike, style: str) -> tuple[Any, list[Any]]:
    """The prompt and one piece per step: piece ``i`` runs from the end of step ``i - 1``'s assistant message to
    the end of step ``i``'s, so it holds what came back after step ``i - 1`` and step ``i``'s turn, and the prompt
    followed by every piece is the conversation up to the last turn. Conversational: message lists; text: the
    transcript cut at the same places (`turns.text_steps`)."""
    if style == TEXT:
        return text_steps(conversation.messages)
    messages = conversation.messages
    ends = [start + 1 for start in conversation.step_starts]
    starts = [conversation.prompt_length, *ends[:-1]]
    return messages[: conversation.prompt_length], [
        messages[start:end] for start, end in zip(starts, ends, strict=True)
    ]


def joined(pieces: Sequence[Any], style: str) -> Any:
    """Consecutive pieces as one."""
    if style == TEXT:
        return "".join(pieces)
    return [message for piece in pieces for message in piece]


def labelled_pieces(pieces: Sequence[Any], steps: Sequence[int], style: str) -> list[Any]:
    """One completion per labelled step (`steps`, ascending): a step left without a label stays in the text as
    context, merged into the next labelled step's piece, so every completion ends at a labelled decision and the
    prompt followed by the completions is the conversation up to the last labelled step."""
    completions, start = [], 0
    for step in steps:
        completions.append(joined(pieces[start : step + 1], style))
        start = step + 1
    return completions


def critique_request(step_index: int | None, span_field: str = "", span_text: str = "") -> str:
    """What the critic is asked, after the transcript (which ends at the critiqued step, if there is one)."""
    if step_index is None:
        return "Critique this trajectory."
    if span_field:
        return f'Critique this part of the last step\'s {span_field}: "{span_text}"'
    return "Critique the last step."


def critique_pair(shown: Sequence[Message], request: str, critique: str, style: str) -> tuple[Any, Any]:
    """(prompt, completion) of a critique row: the transcript of `shown` and the `request` as one user message,
    and the critique as the assistant's answer."""
    return styled(
        style,
        [{"role": "user", "content": f"{transcript(shown)}\n\n{request}"}],
        [{"role": "assistant", "content": critique}],
    )


def rating_is_desirable(score: int | None, thumb_up: bool | None) -> bool | None:
    """A thumb decides; otherwise a 1–5 score of 4 or more is desirable, 2 or less undesirable, 3 says nothing."""
    if thumb_up is not None:
        return thumb_up
    if score is None or score == 3:
        return None
    return score >= 4


# --- rows ----------------------------------------------------------------------------------------------------------


def _with_tools(row: dict[str, Any], tools: list | None) -> dict[str, Any]:
    """`row` with its last column, ``tools``, where it has one (a conversational row)."""
    if tools is not None:
        row["tools"] = tools
    return row


def pair_row(prompt: Any, chosen: Any, rejected: Any, columns: dict[str, Any]) -> dict[str, Any]:
    """A preference or step_preference row: the cut conversation, then the kind's other `columns`."""
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **columns}


def preference_columns(
    *,
    margin: float,
    agreement: float,
    rationale: str,
    annotator_ids: list[int],
    label_ids: list[int],
    task_id: int,
    chosen_trajectory_id: int | None,
    rejected_trajectory_id: int,
    tools: list | None = None,
    tie: bool | None = None,
    source: str | None = None,
    step_index: int | None = None,
) -> dict[str, Any]:
    """The columns of a preference row after prompt, chosen and rejected. `tie` None leaves the ``tie`` column
    out (an export with ``ties=drop``). A step_preference row (`step_preference_columns`) has the same columns,
    with its `source` and `step_index` before ``task_id``; a preference row leaves both None."""
    columns = {
        "margin": margin,
        "agreement": agreement,
        "rationale": rationale,
        "annotator_ids": annotator_ids,
        "label_ids": label_ids,
    }
    if source is not None:
        columns["source"] = source
        columns["step_index"] = step_index
    columns["task_id"] = task_id
    columns["chosen_trajectory_id"] = chosen_trajectory_id
    columns["rejected_trajectory_id"] = rejected_trajectory_id
    # Spelled out rather than `_with_tools`: this runs once for every row of the exports' busiest kinds.
    if tools is not None:
        columns["tools"] = tools
    if tie is not None:
        columns["tie"] = tie
    return columns


def step_preference_columns(*, source: str, step_index: int, **columns: Any) -> dict[str, Any]:
    """The columns of a step_preference row after prompt, chosen and rejected: `preference_columns`' (the same
    keywords; ``chosen_trajectory_id`` None for an intervention), with `source` "intervention" or "comparison" and
    `step_index` the step where the continuations part."""
    return preference_columns(source=source, step_index=step_index, **columns)


def stepwise_row(
    prompt: Any,
    completions: list[Any],
    labels: list[bool],
    *,
    step_indices: list[int],
    agreement: float,
    annotator_ids: list[int],
    label_ids: list[int],
    trajectory_id: int,
    task_id: int,
    source: str,
    tools: list | None = None,
) -> dict[str, Any]:
    """A stepwise (process-reward) row: one completion and one label per labelled step; `source` is "label" or
    "intervention"."""
    row = {
        "prompt": prompt,
        "completions": completions,
        "labels": labels,
        "step_indices": step_indices,
        "agreement": agreement,
        "annotator_ids": annotator_ids,
        "label_ids": label_ids,
        "trajectory_id": trajectory_id,
        "task_id": task_id,
        "source": source,
    }
    return _with_tools(row, tools)


def unpaired_row(
    prompt: Any,
    completion: Any,
    label: bool,
    *,
    agreement: float,
    annotator_ids: list[int],
    label_ids: list[int],
    trajectory_id: int,
    task_id: int,
    tools: list | None = None,
) -> dict[str, Any]:
    """An unpaired (KTO) row: a trajectory split after its prompt, and whether it is desirable."""
    row = {
        "prompt": prompt,
        "completion": completion,
        "label": label,
        "agreement": agreement,
        "annotator_ids": annotator_ids,
        "label_ids": label_ids,
        "trajectory_id": trajectory_id,
        "task_id": task_id,
    }
    return _with_tools(row, tools)


def sft_row(
    messages: list[Message],
    tools: list,
    *,
    source: str,
    step_index: int | None,
    annotator_ids: list[int],
    label_ids: list[int],
    trajectory_id: int,
    task_id: int,
) -> dict[str, Any]:
    """An sft row: a conversation to imitate; `source` is "intervention", "takeover" or "demonstration"."""
    return {
        "messages": messages,
        "tools": tools,
        "source": source,
        "step_index": step_index,
        "annotator_ids": annotator_ids,
        "label_ids": label_ids,
        "trajectory_id": trajectory_id,
        "task_id": task_id,
    }


def critique_row(
    prompt: Any,
    completion: Any,
    *,
    trajectory_id: int,
    task_id: int,
    step_index: int | None,
    span_field: str,
    span_start: int | None,
    span_end: int | None,
    span_text: str,
    tags: list[str],
    annotator_ids: list[int],
    label_ids: list[int],
) -> dict[str, Any]:
    """A critiques row (`critique_pair` makes its prompt and completion)."""
    return {
        "prompt": prompt,
        "completion": completion,
        "trajectory_id": trajectory_id,
        "task_id": task_id,
        "step_index": step_index,
        "span_field": span_field,
        "span_start": span_start,
        "span_end": span_end,
        "span_text": span_text,
        "tags": tags,
        "annotator_ids": annotator_ids,
        "label_ids": label_ids,
    }


def returns_row(
    prompt: Any,
    completions: list[Any],
    rewards: list[float] | None,
    success: bool | None,
    *,
    trajectory_id: int,
    task_id: int,
    policy_version_id: int | None,
    tools: list | None = None,
) -> dict[str, Any]:
    """A returns (value-critic) row: the `step_pieces` of a trajectory with each step's environment reward."""
    row = {
        "prompt": prompt,
        "completions": completions,
        "rewards": rewards,
        "success": success,
        "trajectory_id": trajectory_id,
        "task_id": task_id,
        "policy_version_id": policy_version_id,
    }
    return _with_tools(row, tools)
