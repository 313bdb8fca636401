"""API-wide permission: a read-only token may only read.

It sits in REST_FRAMEWORK's DEFAULT_PERMISSION_CLASSES beside IsAuthenticated, so every API view gets it, the
export endpoints included. A view that sets its own `permission_classes` must keep it (use `API_PERMISSIONS`).
Project roles are checked per view through `feedback_app.access`, which gives outsiders 404 and wrong roles 403.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated

from feedback_app.models import ApiToken


class ReadOnlyTokenPermission(BasePermission):
    message = "This API token is read-only: it may only use GET, HEAD and OPTIONS."

    def has_permission(self, request, view) -> bool:
        token = request.auth
        return not (isinstance(token, ApiToken) and token.read_only and request.method not in SAFE_METHODS)


API_PERMISSIONS = [IsAuthenticated, ReadOnlyTokenPermission]
