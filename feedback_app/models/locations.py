"""Where a project may load models from: its own artifact folders, the admin's shared model roots, and the endpoint
hosts the admin allows.

Every way a model location enters Tandem (the API, the launch forms, the admin, the management commands) and every
place that loads one (`PolicyVersion.policy_spec`, the judge and policy runs) goes through `check_model_path` and
`check_endpoint_url`, so one project can never run another project's weights or make the server call an address
the admin did not allow.

A model directory is confined when its real path (symlinks and ``..`` resolved) lies under one of:
- the project's own artifact folders, ``ARTIFACT_ROOT/policies/<project id>/`` and ``ARTIFACT_ROOT/models/<project
  id>/``, where Tandem writes the policies and judge models a project's runs train;
- a shared model root from ``TANDEM_SHARED_MODEL_ROOTS`` (base models every project may start from).

An endpoint URL is allowed when its host matches an entry of ``TANDEM_ENDPOINT_ALLOWLIST``: a host name
(``vllm``), a domain wildcard (``*.example.com``), an IP address or network (``10.0.0.0/8``), or ``*`` for any host
whose every address is public. Loopback, link-local (the cloud metadata service at 169.254.169.254 among them),
private and reserved addresses pass only through an entry that names them.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class LocationError(ValueError):
    """A model location a project may not use; the message says why, for a 400 beside the field."""


def project_model_roots(project_id: int) -> list[Path]:
    """The folders where a project's own runs write models."""
    root = Path(settings.ARTIFACT_ROOT).resolve()
    return [root / "policies" / str(project_id), root / "models" / str(project_id)]


def shared_model_roots() -> list[Path]:
    return [Path(path).resolve() for path in settings.TANDEM_SHARED_MODEL_ROOTS]


def check_model_path(project_id: int, value: str) -> str:
    """``value`` if it names an existing model directory this project may load; `LocationError` otherwise.

    The stored value is kept as given; the check is made on its real path each time it is used, so a symlink
    changed after registration does not escape either.
    """
    if not isinstance(value, str) or not value.strip():
        raise LocationError("give the model directory's path")
    if "\x00" in value:
        raise LocationError("the path contains a NUL character")
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise LocationError("give an absolute path")
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise LocationError(f"no such directory: {value}") from None
    roots = project_model_roots(project_id) + shared_model_roots()
    if not any(real == root or real.is_relative_to(root) for root in roots):
        shared = ", ".join(str(root) for root in shared_model_roots()) or "none configured"
        raise LocationError(
            f"{value} is outside this project's model folders ({roots[0]}, {roots[1]}) and the shared model roots "
            f"({shared}; an admin sets TANDEM_SHARED_MODEL_ROOTS)"
        )
    if not real.is_dir():
        raise LocationError(f"{value} is not a directory")
    return value


def check_endpoint_url(value: str) -> str:
    """``value`` if it is an http(s) URL whose host the admin's allowlist admits; `LocationError` otherwise."""
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as exc:
        raise LocationError(f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise LocationError("give an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise LocationError("credentials in the URL are not allowed; the worker sends the endpoint's API key")
    allowlist = settings.TANDEM_ENDPOINT_ALLOWLIST
    if not allowlist:
        raise LocationError(
            f"endpoint hosts must be allowed by an admin, and none are (TANDEM_ENDPOINT_ALLOWLIST); ask for {host!r}"
        )
    host = host.lower().rstrip(".")
    literal = _ip_or_none(host)
    for entry in allowlist:
        if _entry_names(entry, host, literal):
            return value
    if "*" in allowlist:
        addresses = [literal] if literal is not None else _resolve(host)
        if not addresses:
            raise LocationError(f"the host {host!r} does not resolve")
        internal = [str(address) for address in addresses if not address.is_global]
        if not internal:
            return value
        raise LocationError(
            f"the host {host!r} is an internal address ({', '.join(internal)}: loopback, link-local, private or "
            "reserved); only an admin can allow it, by naming it in TANDEM_ENDPOINT_ALLOWLIST"
        )
    raise LocationError(f"the host {host!r} is not in the admin's endpoint allowlist (TANDEM_ENDPOINT_ALLOWLIST)")


def _entry_names(entry: str, host: str, literal: IPAddress | None) -> bool:
    """Whether one allowlist entry names this host by itself (``*`` never does: it admits public addresses only)."""
    entry = entry.strip().lower().rstrip(".")
    if entry == "*":
        return False
    if entry.startswith("*."):
        return host.endswith(entry[1:])
    if literal is not None:
        try:
            return literal in ipaddress.ip_network(entry.strip("[]"), strict=False)
        except ValueError:
            return False
    return host == entry


def _ip_or_none(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _resolve(host: str) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
