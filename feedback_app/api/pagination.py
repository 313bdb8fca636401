from __future__ import annotations

from django.conf import settings
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

from feedback_app.text_checks import INT64_MAX


class ApiCursorPagination(CursorPagination):
    """Newest first by id: ids only grow, so a cursor stays stable while rows are added (a label revision or an
    import in progress never shifts a page)."""

    ordering = "-id"
    page_size = settings.TANDEM_API_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = settings.TANDEM_API_MAX_PAGE_SIZE

    def decode_cursor(self, request):
        """DRF's cursor, with its position checked: a tampered cursor whose position is not an id is refused as
        invalid (404, as DRF answers any bad cursor) rather than reaching the database."""
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            position = cursor.position
            if not (position.isascii() and position.isdigit() and int(position) <= INT64_MAX):
                raise NotFound(self.invalid_cursor_message)
        return cursor
