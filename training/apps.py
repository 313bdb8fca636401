from pathlib import Path

from django.apps import AppConfig
from django.conf import settings


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Tandem training"

    def ready(self) -> None:
        # Kombu's filesystem transport does not create its folders, and both the web process (which publishes) and
        # the workers (which consume) need them before the first message.
        options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})
        for key in ("data_folder_in", "data_folder_out", "control_folder"):
            if key in options:
                Path(options[key]).mkdir(parents=True, exist_ok=True)
