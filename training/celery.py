"""The Celery app. Queues: `rollouts` (policy generation), `training` (GPU work), `default` (light work)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "feedback_app.settings")

app = Celery("tandem")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["training"])
