"""The session and the logged-in user, each read with one statement: they are read before every view, and an ORM
query costs more CPU to build than the database spends answering it (see `feedback_app.hot_path`). The session
store and the authentication backend that use these reads are `feedback_app.sessions`."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.utils import timezone

from feedback_app.hot_path.rows import Rows, fetch_one, moment

_SESSIONS = Rows(Session, "s")
_SESSION_SQL = f"SELECT {_SESSIONS.columns} FROM {_SESSIONS.table} WHERE s.session_key = %s AND s.expire_date > %s"

_USERS = Rows(get_user_model(), "u")
_USER_SQL = f"SELECT {_USERS.columns} FROM {_USERS.table} WHERE u.{_USERS.pk_column} = %s"


def live_session(session_key: str) -> Session | None:
    """The unexpired session `session_key`, or None."""
    row = fetch_one(_SESSION_SQL, [session_key, moment(timezone.now())])
    return None if row is None else _SESSIONS.read(row)


def user_by_id(user_id) -> object | None:
    """The user `user_id`, active or not, or None."""
    row = fetch_one(_USER_SQL, [user_id])
    return None if row is None else _USERS.read(row)
