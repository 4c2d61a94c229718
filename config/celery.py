"""The Celery app. Broker and result backend: Redis. JSON only; never pickle."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import before_task_publish

from config import taskauth

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("kvinject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["gpu_worker"])
# every task message we publish is signed; the GPU tasks refuse any other (config.taskauth)
before_task_publish.connect(taskauth.sign_message, weak=False)

# Celery's success line prints the task's return value: a chat's reply text, whatever the
# tenant's audit opt-in. Log the task, its id and run time only.
from celery.app import trace  # noqa: E402

trace.LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"
