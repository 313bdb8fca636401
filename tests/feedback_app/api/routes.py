"""The URL patterns of the API, as Django's resolver holds them."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.urls import URLPattern, URLResolver, get_resolver


def api_routes() -> list[str]:
    """Every URL pattern under /api/, in the resolver's order, written as Django writes it
    (api/projects/<int:project_pk>/tasks/)."""
    routes = []

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("api/"):
                routes.append(route)

    walk(get_resolver().url_patterns, "")
    return routes


def api_path(route: str, argument: str | Callable[[re.Match], str]) -> str:
    """The absolute path of `route` with each path argument (<name> or <converter:name>) replaced by `argument`, as
    `re.sub` replaces: a template such as r"{\\1}" (the argument's name) or a function of the match."""
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", argument, route)
