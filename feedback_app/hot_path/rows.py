"""Model rows from hand-written SQL, for the annotators' busiest request (see `feedback_app.hot_path`).

The statements of that request are written once, as text, and their rows turned into model instances here, converted
exactly as the ORM converts them (SQLite gives text for datetimes and 0/1 for booleans). On PostgreSQL they are also
prepared, once per connection: parsing and planning them again on every request was a third of the database's CPU.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections


class Rows:
    """Instances of `model` from raw SQL that selects `columns` (every concrete column of `model`, or only the named
    fields; the others are deferred, as with `.only()`), each spelt `alias.column`."""

    def __init__(self, model, alias: str, fields: list[str] | None = None):
        self.model = model
        quote = connection.ops.quote_name
        self.name = quote(model._meta.db_table)
        self.table = f"{self.name} {alias}"
        self.pk_column = quote(model._meta.pk.column)
        concrete = model._meta.concrete_fields
        if fields is not None:
            wanted = {model._meta.get_field(name).attname for name in fields} | {model._meta.pk.attname}
            concrete = [field for field in concrete if field.attname in wanted]
        self.fields = concrete
        self.width = len(concrete)
        self.attnames = [field.attname for field in concrete]
        self.columns = ", ".join(f"{alias}.{quote(field.column)}" for field in concrete)
        # What an INSERT of `values(instance)` names: the fields, their columns and placeholders, in the same order.
        self.inserted = [field for field in model._meta.concrete_fields if not field.primary_key]
        self.inserted_columns = ", ".join(quote(field.column) for field in self.inserted)
        self.placeholders = ", ".join(["%s"] * len(self.inserted))
        insert = f"INSERT INTO {self.name} ({self.inserted_columns}) VALUES ({self.placeholders})"
        self._insert_sql = {
            False: f"{insert} RETURNING {self.pk_column}",
            True: f"{insert} ON CONFLICT DO NOTHING RETURNING {self.pk_column}",
        }
        self._converters = None

    def read(self, row) -> Any:
        """The instance from the first `width` values of `row`."""
        if self._converters is None:
            columns = [field.get_col(self.model._meta.db_table) for field in self.fields]
            self._converters = [
                (column, [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)])
                for column in columns
            ]
        db = connections[DEFAULT_DB_ALIAS]  # `connection` is a proxy that looks the connection up on every use
        values = []
        for value, (column, converters) in zip(row[: self.width], self._converters, strict=True):
            for convert in converters:
                value = convert(value, column, db)
            values.append(value)
        return self.model.from_db(DEFAULT_DB_ALIAS, self.attnames, values)

    def insert(self, instance, *, unless_conflict: bool = False) -> bool:
        """Store the new `instance` as save() would (auto_now_add fields are filled in), without its signals; its
        primary key comes back from the database. With `unless_conflict`, a row that a unique index refuses is not
        stored (ON CONFLICT DO NOTHING, on PostgreSQL and SQLite alike) and False is returned, instead of raising
        IntegrityError and spoiling the transaction."""
        with sql_cursor() as cursor:
            cursor.execute(self._insert_sql[unless_conflict], self.values(instance))
            row = cursor.fetchone()
        if row is None:
            return False
        self.stored(instance, row[0])
        return True

    def values(self, instance) -> list:
        """The new `instance`'s values for `inserted_columns`, as save() would store them (auto_now_add filled in)."""
        db = connections[DEFAULT_DB_ALIAS]
        return [field.get_db_prep_save(field.pre_save(instance, True), db) for field in self.inserted]

    def stored(self, instance, pk) -> None:
        """Mark `instance` as the row that was just inserted with primary key `pk`."""
        instance.pk = pk
        instance._state.adding, instance._state.db = False, DEFAULT_DB_ALIAS


MAX_ID = 2**63 - 1  # an id from a URL beyond this is nobody's (and SQLite cannot take it as a parameter)


def moment(value: datetime):
    """A datetime as a query parameter: SQLite compares the text the ORM stores, so it must be spelled the same."""
    return connection.ops.adapt_datetimefield_value(value)


def fetch_one(sql: str, params: list) -> tuple | None:
    with sql_cursor() as db:
        db.execute(sql, params)
        return db.fetchone()


def fetch_all(sql: str, params: list) -> list[tuple]:
    with sql_cursor() as db:
        db.execute(sql, params)
        return db.fetchall()


_NEVER_BY_COUNT = 2**31


@functools.cache
def _preparing_cursor_class() -> type:
    """psycopg's cursor that binds parameters on the server, preparing every statement it runs (psycopg keeps the
    most recent hundred prepared per connection). Built on first use, so SQLite installs need no psycopg."""
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparingCursor(ServerBindingCursor):
        def execute(self, query, params=None, *, prepare=None, binary=None):
            return super().execute(query, params, prepare=True, binary=binary)

    return PreparingCursor


def sql_cursor():
    """A cursor for the statements written here: Django's (errors, query logging and the test suite's query counts
    work as for any other), and on PostgreSQL one that prepares each statement, unless DATABASE_PREPARED_STATEMENTS
    is off (for a connection pooler that cannot keep prepared statements)."""
    db = connections[DEFAULT_DB_ALIAS]  # looked up once: each use of the `connection` proxy looks it up again
    if db.vendor != "postgresql" or not settings.DATABASE_PREPARED_STATEMENTS:
        return db.cursor()
    db.close_if_health_check_failed()
    db.ensure_connection()
    # Django switches psycopg's preparing off (None); any number turns it on, and the preparing cursor asks for it.
    # Django's own cursors bind on the client and are never prepared, so only these statements are.
    db.connection.prepare_threshold = _NEVER_BY_COUNT
    with db.wrap_database_errors:
        return db._prepare_cursor(_preparing_cursor_class()(db.connection))
