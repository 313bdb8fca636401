"""Response headers Django does not set on its own."""

from __future__ import annotations

from collections.abc import Callable

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
