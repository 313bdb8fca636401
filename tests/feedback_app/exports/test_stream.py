from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from feedback_app.exports import (
    ExportFilters,
    ExportFormat,
    ExportKind,
    ExportRow,
    RowTally,
    export_chunks,
    export_rows,
)
from feedback_app.exports.filters import Style
from feedback_app.exports.schemas import export_schema
from feedback_app.exports.stream import jsonl_chunks, jsonl_line, parquet_chunks
from tests.feedback_app.exports.helpers import as_in_jsonl


def jsonl_rows(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


@pytest.mark.parametrize("kind", list(ExportKind))
def test_every_kind_writes_its_schemas_columns_in_both_formats(labelled_project, kind):
    filters = ExportFilters()
    tally = RowTally()
    jsonl = b"".join(export_chunks(labelled_project, kind, filters, ExportFormat.JSONL, tally))
    parquet = b"".join(export_chunks(labelled_project, kind, filters, ExportFormat.PARQUET))

    from_jsonl = jsonl_rows(jsonl)
    table = pq.read_table(io.BytesIO(parquet))
    schema = export_schema(kind)
    assert from_jsonl, f"the fixture should give {kind} rows"
    assert tally.count == len(from_jsonl) == table.num_rows
    assert all(list(row) == schema.names for row in from_jsonl)
    assert table.schema.names == schema.names
    if kind != ExportKind.RAW:  # raw's created_at is a timestamp in Parquet and ISO text in JSON
        assert as_in_jsonl(table.to_pylist()) == from_jsonl


@pytest.mark.parametrize("kind", [ExportKind.PREFERENCE, ExportKind.UNPAIRED, ExportKind.CRITIQUES])
def test_the_text_style_has_string_columns(labelled_project, kind):
    filters = ExportFilters(style=Style.TEXT)
    parquet = b"".join(export_chunks(labelled_project, kind, filters, ExportFormat.PARQUET))
    table = pq.read_table(io.BytesIO(parquet))
    assert str(table.schema.field("prompt").type) == "string"
    assert all(isinstance(value, str) for value in table.column("prompt").to_pylist())


def test_an_empty_export_is_still_a_typed_parquet_file(project):
    parquet = b"".join(export_chunks(project, ExportKind.STEPWISE, ExportFilters(), ExportFormat.PARQUET))
    table = pq.read_table(io.BytesIO(parquet))
    assert table.num_rows == 0
    assert table.schema.names == export_schema(ExportKind.STEPWISE).names
    assert b"".join(export_chunks(project, ExportKind.STEPWISE, ExportFilters(), ExportFormat.JSONL)) == b""


def test_parquet_is_yielded_a_row_group_at_a_time():
    schema = export_schema(ExportKind.SFT)
    rows = [
        {
            "messages": [{"role": "system", "content": f"task {i}"}],
            "tools": "[]",
            "source": "demonstration",
            "step_index": None,
            "annotator_ids": [],
            "label_ids": [],
            "trajectory_id": i,
            "task_id": 1,
        }
        for i in range(25)
    ]
    consumed = []

    def source():
        for row in rows:
            consumed.append(row)
            yield row

    stream = parquet_chunks(source(), schema, row_group_size=10)
    first = next(stream)
    assert first.startswith(b"PAR1")
    assert len(consumed) == 10  # the first row group went out before the rest was read
    chunks = [first, *stream]
    assert len(chunks) == 3  # two full row groups as they filled, then the last one with the footer
    parquet_file = pq.ParquetFile(io.BytesIO(b"".join(chunks)))
    assert parquet_file.metadata.num_row_groups == 3
    assert as_in_jsonl(parquet_file.read().to_pylist()) == [{**row, "tools": []} for row in rows]


def test_jsonl_is_yielded_in_chunks_of_whole_lines():
    rows = [{"i": i, "text": "x" * 100} for i in range(50)]
    chunks = list(jsonl_chunks((ExportRow(row, "test", []) for row in rows), chunk_bytes=1000))
    assert len(chunks) > 3
    assert all(chunk.endswith(b"\n") for chunk in chunks)
    assert jsonl_rows(b"".join(chunks)) == rows


def test_spliced_json_is_the_same_line_as_encoding_the_row(project, annotator, grid_trajectory, compare):
    odd = 'quote " backslash \\ newline \n tab \t accents é ü 中文 emoji 🙂 control \x01'
    first, second = grid_trajectory(["up", "right"]), grid_trajectory(["down"])
    for trajectory in (first, second):
        trajectory.prompt[0]["content"] = odd
        trajectory.save(update_fields=["prompt"])
    step = first.steps.get(index=0)
    step.message = {**step.message, "content": odd}
    step.save(update_fields=["message"])
    compare(annotator, first, second, rationale=odd)

    [row] = export_rows(project, ExportKind.PREFERENCE, ExportFilters())

    assert row.json_head is not None
    assert jsonl_line(row) == json.dumps(row.values, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(jsonl_line(row))["prompt"][0]["content"] == odd


def test_the_reused_row_encoder_writes_what_a_fresh_json_encoder_writes():
    import datetime as dt

    from feedback_app.exports.stream import _encode

    row = {
        "text": 'quotes " and \\ and \n and é 漢字 😀 \u2028',
        "numbers": [0, -1, 2**63, 0.1, 1e-300, 1e300, float("nan"), float("inf"), -float("inf")],
        "flags": [True, False, None],
        "nested": {"ids": [1, 2], "empty": {}, "list": []},
        "at": dt.datetime(2026, 11, 26, 4, 5, 6, tzinfo=dt.UTC),
    }
    fresh = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=lambda value: value.isoformat())
    assert _encode(row) == fresh.encode(row)
    assert json.loads(_encode(row))["at"] == "2026-11-26T04:05:06+00:00"
    with pytest.raises(TypeError, match="set is not JSON serialisable"):
        _encode({"bad": {1}})
