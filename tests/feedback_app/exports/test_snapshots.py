from __future__ import annotations

import hashlib

import pytest

from feedback_app.exports import (
    ExportFilters,
    ExportFormat,
    ExportKind,
    ExportRequestError,
    create_snapshot,
    export_chunks,
    read_snapshot_rows,
    snapshot_filters,
)
from feedback_app.models import Comparison, DatasetSnapshot
from tests.feedback_app.exports.helpers import as_in_jsonl, rows


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    return settings.ARTIFACT_ROOT


def test_a_snapshot_freezes_the_export_with_its_hash_and_row_ids(labelled_project, researcher, artifact_root):
    filters = ExportFilters.from_query({"min_agreement": "0.5"})
    live = b"".join(export_chunks(labelled_project, ExportKind.PREFERENCE, filters, ExportFormat.JSONL))

    snapshot = create_snapshot(labelled_project, "preference", filters, user=researcher, name="rm data v1")

    path = snapshot.file
    assert path.parent == artifact_root / "snapshots" / str(labelled_project.pk)
    assert path.read_bytes() == live
    assert snapshot.content_hash == hashlib.sha256(live).hexdigest()
    exported = rows(labelled_project, "preference", min_agreement="0.5")
    assert snapshot.row_count == len(exported) == len(list(read_snapshot_rows(snapshot)))
    expected_ids = sorted({label for row in exported for label in row["label_ids"]})
    assert snapshot.row_ids == [f"comparison:{pk}" for pk in expected_ids]
    assert (snapshot.export_kind, snapshot.filters, snapshot.created_by) == (
        "preference",
        {"min_agreement": 0.5},
        researcher,
    )
    assert snapshot_filters(snapshot) == filters
    assert not list(path.parent.glob("*.part"))


def test_a_snapshot_stays_the_same_bytes_when_labels_change(labelled_project, researcher, annotator):
    snapshot = create_snapshot(labelled_project, "preference", ExportFilters(), user=researcher, name="frozen")
    before = snapshot.file.read_bytes()
    for label in Comparison.objects.filter(project=labelled_project, annotator=annotator, is_current=True):
        label.revise(choice="both_bad")

    assert rows(labelled_project, "preference") != list(read_snapshot_rows(snapshot))
    assert snapshot.file.read_bytes() == before
    assert snapshot.verify()


def test_a_tampered_file_fails_verification(labelled_project, researcher):
    snapshot = create_snapshot(labelled_project, "unpaired", ExportFilters(), user=researcher, name="kto")
    with snapshot.file.open("ab") as out:
        out.write(b"\n")
    assert not snapshot.verify()


def test_a_parquet_snapshot_reads_back_the_same_rows(labelled_project, researcher):
    snapshot = create_snapshot(
        labelled_project, ExportKind.STEPWISE, ExportFilters(), user=researcher, name="prm", fmt="parquet"
    )
    assert snapshot.file.suffix == ".parquet"
    exported = rows(labelled_project, "stepwise")
    assert as_in_jsonl(list(read_snapshot_rows(snapshot))) == exported
    # Rows from step labels cite those labels; rows an intervention implies cite the intervention.
    expected = {f"step_label:{i}" for row in exported if row["source"] == "label" for i in row["label_ids"]}
    expected |= {f"intervention:{i}" for row in exported if row["source"] == "intervention" for i in row["label_ids"]}
    assert {row["source"] for row in exported} == {"label", "intervention"}
    assert set(snapshot.row_ids) == expected


def test_a_taken_name_is_refused_and_leaves_no_file(labelled_project, researcher, artifact_root):
    create_snapshot(labelled_project, "sft", ExportFilters(), user=researcher, name="sft")
    with pytest.raises(ExportRequestError) as caught:
        create_snapshot(labelled_project, "sft", ExportFilters(), user=researcher, name="sft")
    assert set(caught.value.errors) == {"name"}
    assert len(list((artifact_root / "snapshots" / str(labelled_project.pk)).iterdir())) == 1


def test_filters_that_do_not_suit_the_kind_store_nothing(labelled_project, researcher, artifact_root):
    with pytest.raises(ExportRequestError) as caught:
        create_snapshot(labelled_project, "raw", ExportFilters(min_agreement=0.5), user=researcher, name="raw")
    assert set(caught.value.errors) == {"min_agreement"}
    assert not DatasetSnapshot.objects.exists()
    assert not (artifact_root / "snapshots").exists()
