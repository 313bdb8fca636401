"""Raw SQL inserts for an import's trajectories and steps, with a PostgreSQL fast path.

The ORM's bulk_create compiles and quotes SQL for every object, which makes it most of the time of a large import;
steps alone are most of the rows. So steps go in through one prepared statement (executemany) and, on PostgreSQL,
both trajectories and steps go in through COPY, which streams the rows with no per-row SQL at all. COPY and
`nextval` over the table's sequence have no ORM equivalent, hence the raw SQL here. Everything else in the import
uses the ORM.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from django.db import connection

from feedback_app.models import Step, Trajectory

STEP_FIELDS = (
    "trajectory",
    "index",
    "message",
    "replies",
    "observation",
    "reasoning",
    "action",
    "tool_calls",
    "env_reward",
    "logprob",
    "media",
    "render",
    "done",
)


def insert_trajectories(trajectories: list[Trajectory]) -> None:
    """bulk_create, except on PostgreSQL: there the ids are taken from the table's sequence first and the rows go
    in through COPY, which skips the per-row SQL compiling and quoting that make bulk_create slow. The values are
    still each field's own get_db_prep_save(), so nothing about the model is repeated here."""
    if connection.vendor != "postgresql":
        Trajectory.objects.bulk_create(trajectories, batch_size=1000)
        return
    quote = connection.ops.quote_name
    table = Trajectory._meta.db_table
    fields = Trajectory._meta.concrete_fields
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [table, Trajectory._meta.pk.column, len(trajectories)],
        )
        for trajectory, (pk,) in zip(trajectories, cursor.fetchall(), strict=True):
            trajectory.pk = pk
        columns = ", ".join(quote(field.column) for field in fields)
        with cursor.cursor.copy(f"COPY {quote(table)} ({columns}) FROM STDIN") as copy:
            for trajectory in trajectories:
                copy.write_row(
                    [field.get_db_prep_save(field.pre_save(trajectory, add=True), connection) for field in fields]
                )
    for trajectory in trajectories:
        trajectory._state.adding = False
        trajectory._state.db = connection.alias


def insert_steps(rows: Iterable[tuple]) -> None:
    """Insert step rows (values in STEP_FIELDS order) with one prepared statement.

    Steps are most of an import's rows, and bulk_create spends about three quarters of its time compiling SQL for
    each object; executemany sends the same statement with plain values instead, several times faster. The values
    are what the fields would store: text, numbers and adapted JSON.
    """
    quote = connection.ops.quote_name
    table = quote(Step._meta.db_table)
    columns = ", ".join(quote(Step._meta.get_field(name).column) for name in STEP_FIELDS)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # PostgreSQL's COPY takes the rows as one stream, several times faster again than executemany.
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(STEP_FIELDS))})"
        rows = iter(rows)
        while batch := list(islice(rows, 5000)):
            cursor.executemany(sql, batch)
