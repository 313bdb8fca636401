"""The columns of every export kind as Arrow schemas: Parquet files are written with them, and JSONL rows carry
the same keys in the same order. Fixed schemas keep every row group, and an empty export, typed the same way.

A kind's columns depend only on the request's `style` and `ties`, never on the rows: with `ties=include` every
preference or step_preference row has a `tie` column (last), with `ties=drop` none has.

A chat message is a struct of the OpenAI fields (role, content, tool_calls with their function name and arguments
text, tool_call_id, name); fields a message lacks are null. A conversational row's `tools` (the tool schemas the
agent was offered) are JSON schemas of any shape, so in Parquet they are one JSON text: `json.loads` it before
giving it to a chat template. JSONL rows carry them as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feedback_app.exports.filters import ExportKind, Style, Ties

if TYPE_CHECKING:
    import pyarrow as pa


def export_schema(kind: ExportKind, style: Style = Style.CONVERSATIONAL, ties: Ties = Ties.DROP) -> pa.Schema:
    import pyarrow as pa

    from feedback_app.exports.raw import RAW_COLUMNS

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
            ("name", pa.string()),
        ]
    )
    messages = pa.list_(message)
    conversational = style == Style.CONVERSATIONAL
    turns = messages if conversational else pa.string()
    tools = [("tools", pa.string())] if conversational else []
    ids = pa.list_(pa.int64())
    provenance = [("annotator_ids", ids), ("label_ids", ids)]
    pair = [("prompt", turns), ("chosen", turns), ("rejected", turns), ("margin", pa.float64())]
    pair += [("agreement", pa.float64()), ("rationale", pa.string()), *provenance]
    pair_trajectories = [("chosen_trajectory_id", pa.int64()), ("rejected_trajectory_id", pa.int64())]
    trajectory = [("trajectory_id", pa.int64()), ("task_id", pa.int64())]

    if kind == ExportKind.PREFERENCE:
        fields = [*pair, ("task_id", pa.int64()), *pair_trajectories, *tools]
    elif kind == ExportKind.STEP_PREFERENCE:
        fields = [*pair, ("source", pa.string()), ("step_index", pa.int64()), ("task_id", pa.int64())]
        fields += [*pair_trajectories, *tools]
    elif kind == ExportKind.STEPWISE:
        fields = [("prompt", turns), ("completions", pa.list_(turns)), ("labels", pa.list_(pa.bool_()))]
        fields += [("step_indices", ids), ("agreement", pa.float64()), *provenance, *trajectory]
        fields += [("source", pa.string()), *tools]
    elif kind == ExportKind.UNPAIRED:
        fields = [("prompt", turns), ("completion", turns), ("label", pa.bool_()), ("agreement", pa.float64())]
        fields += [*provenance, *trajectory, *tools]
    elif kind == ExportKind.SFT:
        fields = [("messages", messages), ("tools", pa.string()), ("source", pa.string())]
        fields += [("step_index", pa.int64()), *provenance, *trajectory]
    elif kind == ExportKind.CRITIQUES:
        fields = [("prompt", turns), ("completion", turns), *trajectory, ("step_index", pa.int64())]
        fields += [("span_field", pa.string()), ("span_start", pa.int64()), ("span_end", pa.int64())]
        fields += [("span_text", pa.string()), ("tags", pa.list_(pa.string())), *provenance]
    elif kind == ExportKind.RETURNS:
        fields = [("prompt", turns), ("completions", pa.list_(turns))]
        fields += [("rewards", pa.list_(pa.float64())), ("success", pa.bool_()), *trajectory]
        fields += [("policy_version_id", pa.int64()), *tools]
    else:
        types = {
            "label_kind": pa.string(),
            "is_current": pa.bool_(),
            "annotator": pa.string(),
            "created_at": pa.timestamp("us", tz="UTC"),
            "seconds_spent": pa.float64(),
            "query_strategy": pa.string(),
            "is_gold": pa.bool_(),
            "gold_answer": pa.string(),
            "displayed_order": pa.string(),
            "choice": pa.string(),
            "rationale": pa.string(),
            "span_field": pa.string(),
            "text": pa.string(),
            "tags": pa.list_(pa.string()),
            "thumb_up": pa.bool_(),
            "comment": pa.string(),
            "original_message": pa.string(),
            "corrected_message": pa.string(),
            "original_reasoning": pa.string(),
            "original_action": pa.string(),
            "corrected_reasoning": pa.string(),
            "corrected_action": pa.string(),
            "takeover_actions": pa.list_(pa.string()),
            "reason": pa.string(),
        }
        # Everything else in the raw layout is an id, an index or a small integer.
        fields = [(name, types.get(name, pa.int64())) for name in RAW_COLUMNS]
    if ties == Ties.INCLUDE and kind in (ExportKind.PREFERENCE, ExportKind.STEP_PREFERENCE):
        fields.append(("tie", pa.bool_()))
    return pa.schema(fields)
