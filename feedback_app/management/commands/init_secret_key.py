from __future__ import annotations

import secrets

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Generate the embedded set-up's secret key file once (TANDEM_DATA_DIR/secret_key); keep it afterwards."

    def handle(self, *args, **options) -> None:
        path = settings.SECRET_KEY_FILE
        if path.exists():
            self.stdout.write(f"Secret key kept: {path}")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(50))
        self.stdout.write(f"Secret key generated: {path}")
