"""Who is asking: the session and its user, read on every request, each with one hand-written statement.

Django's database sessions and its ModelBackend, except for how they read: an ORM query costs more CPU to build than
the database spends answering it, and these two run before every view (see feedback_app/rows.py). Sessions are
stored, rotated and flushed exactly as Django does it (SESSION_ENGINE = "feedback_app.sessions").
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.backends import db
from django.contrib.sessions.models import Session
from django.utils import timezone

from feedback_app.rows import Rows, fetch_one, moment

_SESSIONS = Rows(Session, "s")
_SESSION_SQL = f"SELECT {_SESSIONS.columns} FROM {_SESSIONS.table} WHERE s.session_key = %s AND s.expire_date > %s"


class SessionStore(db.SessionStore):
    def _get_session_from_db(self):
        row = fetch_one(_SESSION_SQL, [self.session_key, moment(timezone.now())])
        if row is None:
            self._session_key = None  # as Django does: a missing or expired session starts afresh
            return None
        return _SESSIONS.read(row)


_USERS = Rows(get_user_model(), "u")
_USER_SQL = f"SELECT {_USERS.columns} FROM {_USERS.table} WHERE u.{_USERS.pk_column} = %s"


class UserBackend(ModelBackend):
    """ModelBackend, with the logged-in user read by one hand-written statement."""

    def get_user(self, user_id):
        row = fetch_one(_USER_SQL, [user_id])
        if row is None:
            return None
        user = _USERS.read(row)
        return user if self.user_can_authenticate(user) else None
