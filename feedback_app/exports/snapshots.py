"""Dataset snapshots: a filtered export frozen to a file under ARTIFACT_ROOT, with the ids of the stored rows it was
made from and the SHA-256 of its bytes, so a training run cites exactly what it trained on and anyone can fetch
the same bytes again.

Training reads a snapshot's file through its model, `DatasetSnapshot.file` (a path for ``datasets.load_dataset``),
and checks it with `DatasetSnapshot.verify`; `read_snapshot_rows` here streams its rows for other readers::

    builder = DATASETS_BUILDER[snapshot_format(snapshot)]
    dataset = datasets.load_dataset(builder, data_files=str(snapshot.file), split="train")
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from feedback_app.exports.filters import ExportFilters, ExportFormat, ExportKind, ExportRequestError
from feedback_app.exports.stream import RowTally, export_chunks
from feedback_app.models import DatasetSnapshot, Project

SNAPSHOT_DIR = "snapshots"
# The `datasets.load_dataset` builder that reads each format.
DATASETS_BUILDER = {ExportFormat.JSONL: "json", ExportFormat.PARQUET: "parquet"}
NAME_MAX_LENGTH = DatasetSnapshot._meta.get_field("name").max_length


def create_snapshot(
    project: Project,
    kind: ExportKind | str,
    filters: ExportFilters,
    *,
    user,
    name: str,
    fmt: ExportFormat | str = ExportFormat.JSONL,
) -> DatasetSnapshot:
    """Write the export to ``ARTIFACT_ROOT/snapshots/<project id>/``, hashing the bytes as they are written, and
    record it. The file is complete before the row exists, and a failed insert removes the file, so a snapshot row
    always points at its whole file. Raises `ExportRequestError` (naming the field) for a bad or taken name or
    filters that do not suit the kind.
    """
    kind, fmt = ExportKind(kind), ExportFormat(fmt)
    name = name.strip()
    if not name:
        raise ExportRequestError({"name": "A snapshot needs a name."})
    if len(name) > NAME_MAX_LENGTH:
        raise ExportRequestError({"name": f"At most {NAME_MAX_LENGTH} characters."})
    if DatasetSnapshot.objects.filter(project=project, name=name).exists():
        raise ExportRequestError({"name": f"This project already has a snapshot named {name!r}."})
    filters.check_kind(kind)

    relative = Path(SNAPSHOT_DIR) / str(project.pk) / f"{slugify(name)[:60] or 'snapshot'}-{uuid4().hex[:12]}.{fmt}"
    final = Path(settings.ARTIFACT_ROOT) / relative
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".part")
    digest = hashlib.sha256()
    tally = RowTally(keep_ids=True)
    try:
        with partial.open("wb") as out:
            for chunk in export_chunks(project, kind, filters, fmt, tally):
                out.write(chunk)
                digest.update(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)
        try:
            with transaction.atomic():
                return DatasetSnapshot.objects.create(
                    project=project,
                    name=name,
                    export_kind=kind.value,
                    filters=filters.as_dict(),
                    row_ids=tally.row_ids(),
                    row_count=tally.count,
                    content_hash=digest.hexdigest(),
                    path=str(relative),
                    created_by=user,
                )
        except IntegrityError:
            final.unlink(missing_ok=True)
            raise ExportRequestError({"name": f"This project already has a snapshot named {name!r}."}) from None
    finally:
        partial.unlink(missing_ok=True)


def snapshot_format(snapshot: DatasetSnapshot) -> ExportFormat:
    return ExportFormat(Path(snapshot.path).suffix.lstrip("."))


def snapshot_filters(snapshot: DatasetSnapshot) -> ExportFilters:
    """The filters the snapshot was made with, as an `ExportFilters` again."""
    return ExportFilters.from_query(snapshot.filters)


def read_snapshot_rows(snapshot: DatasetSnapshot) -> Iterator[dict[str, Any]]:
    """The snapshot's rows as dicts, streamed from the file (JSONL line by line, Parquet a row group at a time)."""
    if snapshot_format(snapshot) == ExportFormat.JSONL:
        with snapshot.open() as stream:
            for line in stream:
                if line.strip():
                    yield json.loads(line)
        return
    import pyarrow.parquet as pq

    with snapshot.open() as stream:
        for batch in pq.ParquetFile(stream).iter_batches():
            yield from batch.to_pylist()
