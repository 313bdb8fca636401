from __future__ import annotations

from django.conf import settings
from rest_framework.pagination import CursorPagination


class ApiCursorPagination(CursorPagination):
    """Newest first by id: ids only grow, so a cursor stays stable while rows are added (a label revision or an
    import in progress never shifts a page)."""

    ordering = "-id"
    page_size = settings.TANDEM_API_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = settings.TANDEM_API_MAX_PAGE_SIZE
