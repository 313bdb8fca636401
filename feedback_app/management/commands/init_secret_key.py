from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from feedback_app.secret_key import ensure_secret_key_file


class Command(BaseCommand):
    help = (
        "Generate the embedded set-up's secret key file once (TANDEM_DATA_DIR/secret_key); keep it afterwards. "
        "Before the first start with DEBUG off, use `python -m feedback_app.secret_key`, which needs no settings."
    )

    def handle(self, *args, **options) -> None:
        path = settings.SECRET_KEY_FILE
        written = ensure_secret_key_file(path)
        self.stdout.write(f"Secret key {'generated' if written else 'kept'}: {path}")
