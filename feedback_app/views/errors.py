"""Error answers: JSON under /api/ (what an API client parses), a styled page everywhere else.

Django calls these for the 400, 403, 404 and 500 it raises itself (a URL no pattern matches, a PermissionDenied or
Http404 from a view, an uncaught exception); DRF answers its own views' errors in JSON already. None of them says
more than the status: no URL patterns, no traceback, no hint that a project exists.
"""

from __future__ import annotations

from django.db import OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

MESSAGES = {
    400: ("Bad request", "The request could not be understood."),
    403: ("Not allowed", "Your role does not allow this."),
    404: ("Not found", "There is nothing here, or it is not yours to see."),
    500: ("Server error", "Something went wrong on our side. It has been logged; please try again."),
    503: ("Busy", "The database is busy with other work; send the request again in a few seconds."),
}
# Seconds a client is asked to wait before sending a request the busy database turned away.
BUSY_RETRY_AFTER = 5


def _answer(request: HttpRequest, status: int, reason: str = "") -> HttpResponse:
    title, detail = MESSAGES[status]
    detail = reason or detail
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": detail}, status=status)
    if getattr(request, "htmx", False):
        # A fragment swapped into the page beside what was asked for, not a whole page inside it.
        return render(request, "_error_fragment.html", {"detail": detail}, status=status)
    return render(request, "error.html", {"status": status, "title": title, "detail": detail}, status=status)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    return _answer(request, 400)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Tandem's own PermissionDenied messages name the role that is needed; they reveal nothing else.
    return _answer(request, 403, str(exception) if exception.args else "")


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    return _answer(request, 404)


def server_error(request: HttpRequest) -> HttpResponse:
    # The 500 page must not depend on anything that may have failed: no context processors' database reads.
    title, detail = MESSAGES[500]
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": detail}, status=500)
    from django.template import loader

    return HttpResponse(loader.get_template("500.html").render({"title": title, "detail": detail}), status=500)


class DatabaseBusyMiddleware:
    """A request that waited out SQLite's lock timeout (another process held the one write lock all along) answers
    503 with Retry-After instead of a 500: the write it waited for was not made (the lock is taken before it, and a
    label's writes are one transaction), and the same request can be sent again as it is (label submits are
    idempotent by their client token)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not (isinstance(exception, OperationalError) and "database is locked" in str(exception)):
            return None
        response = _answer(request, 503)
        response["Retry-After"] = str(BUSY_RETRY_AFTER)
        return response
