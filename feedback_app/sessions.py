"""Who is asking: the session and its user, read on every request, each with one hand-written statement.

Django's database sessions and its ModelBackend, except for how they read (`feedback_app.hot_path.sessions`): an ORM
query costs more CPU to build than the database spends answering it, and these two run before every view. Sessions
are stored, rotated and flushed exactly as Django does it (SESSION_ENGINE = "feedback_app.sessions"). The backend's
dotted path is stored in every logged-in session, so it stays here.
"""

from __future__ import annotations

from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.backends import db

from feedback_app.hot_path.sessions import live_session, user_by_id


class SessionStore(db.SessionStore):
    def _get_session_from_db(self):
        session = live_session(self.session_key)
        if session is None:
            self._session_key = None  # as Django does: a missing or expired session starts afresh
        return session


class UserBackend(ModelBackend):
    """ModelBackend, with the logged-in user read by one hand-written statement."""

    def get_user(self, user_id):
        user = user_by_id(user_id)
        if user is None:
            return None
        return user if self.user_can_authenticate(user) else None
