"""Celery tasks: take ids, load fresh rows from Postgres, hand off to ``injection``."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from django.conf import settings

from gpu_worker import chat_service

log = logging.getLogger(__name__)


@shared_task(
    name="gpu_worker.tasks.chat",
    queue="gpu",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.CHAT_SOFT_TIME_LIMIT,
    time_limit=settings.CHAT_HARD_TIME_LIMIT,
)
def chat(
    member_id: int,
    conversation_id: int | None,
    message: str,
    params: dict[str, Any],
    request_id: str,
    enqueued_at: float | None = None,
) -> dict[str, Any]:
    """One chat turn for a member; returns the API response body (JSON-safe)."""
    started = time.monotonic()
    result = chat_service.answer(member_id, conversation_id, message, params, request_id)
    log.info(
        "chat request_id=%s tier=%s tokens=%s+%s %.0fms",
        request_id, result["cache"]["tier"], result["usage"]["prompt_tokens"],
        result["usage"]["completion_tokens"], (time.monotonic() - started) * 1000,
    )
    return result
