"""Personal API tokens for scripts and notebooks.

Only a SHA-256 of the key is stored; the key itself is shown once, when it is made. A token acts as its user, with
the user's project roles, and a read-only token may only use safe methods.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

KEY_PREFIX = "tdm_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'eval notebook'.")
    prefix = models.CharField(max_length=12, help_text="The first characters of the key, to recognise it by.")
    key_hash = models.CharField(max_length=64, unique=True)
    read_only = models.BooleanField(default=False, help_text="Only GET, HEAD and OPTIONS requests.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(key_hash__regex=r"^[0-9a-f]{64}$"), name="apitoken_hash_is_sha256"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user, name: str, read_only: bool = False) -> tuple[ApiToken, str]:
        """Create a token and return it with its key, which is never stored and cannot be shown again."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, prefix=key[: len(KEY_PREFIX) + 6], key_hash=hash_key(key), read_only=read_only
        )
        return token, key

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])
