"""The Celery app. Broker and result backend: Redis. JSON only; never pickle."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("kvinject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["gpu_worker"])
