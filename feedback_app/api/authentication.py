"""Personal API tokens: `Authorization: Bearer <key>` (or `Token <key>`) acts as the token's user.

Only the key's SHA-256 is stored, so a lookup hashes the presented key. A revoked token, an unknown key or an
inactive user gets 401. `last_used_at` is written at most once a minute, so a busy script does not turn every read
into a write.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from feedback_app.models import ApiToken
from feedback_app.models.tokens import hash_key

KEYWORDS = (b"bearer", b"token")
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in KEYWORDS:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header: expected 'Bearer <key>' with one key.")
        try:
            key = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Authorization header: the key is not valid text.") from None
        token = ApiToken.objects.select_related("user").filter(key_hash=hash_key(key)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid API token.")
        if not token.is_active:
            raise exceptions.AuthenticationFailed("This API token was revoked.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is inactive.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token.user, token

    def authenticate_header(self, request) -> str:
        # Makes an unauthenticated request a 401 with a WWW-Authenticate challenge rather than a bare 403.
        return 'Bearer realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        definition = build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")
        definition["description"] = (
            "A personal API token from /account/tokens/, sent as `Authorization: Bearer <key>` "
            "(`Token <key>` works too). A read-only token may only use GET, HEAD and OPTIONS."
        )
        return definition
