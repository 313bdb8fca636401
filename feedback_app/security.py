"""Response headers Django does not set on its own."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class ContentSecurityPolicyMiddleware:
    """Sends `TANDEM_CSP` as the Content-Security-Policy of every response that does not set its own: pages load
    scripts, styles and data only from Tandem itself (htmx included, served from our static files)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.TANDEM_CSP:
            response.headers.setdefault("Content-Security-Policy", settings.TANDEM_CSP)
        return response


def csp_allowing(*directives: str):
    """A view decorator: the view's answers carry `TANDEM_CSP` with `directives` added (e.g. ``"worker-src 'self'
    blob:"``), for the one page that needs them. With `TANDEM_CSP` empty there is no policy to extend."""

    def decorate(view):
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            response = view(request, *args, **kwargs)
            if settings.TANDEM_CSP:
                response.headers["Content-Security-Policy"] = "; ".join((settings.TANDEM_CSP, *directives))
            return response

        return wrapped

    return decorate
