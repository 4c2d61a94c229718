"""Web side: dispatch a chat turn to the GPU workers and wait for the answer."""

from __future__ import annotations

import time
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.conf import settings

from tenants import errors


def run_chat(
    member_id: int, conversation_id: int | None, message: str, params: dict, request_id: str
) -> dict[str, Any]:
    from gpu_worker.tasks import chat

    try:
        async_result = chat.apply_async(
            args=(member_id, conversation_id, message, params, request_id, time.time()),
            queue="gpu",
            task_id=request_id,
        )
    except Exception as exc:  # broker down
        raise errors.WorkerUnavailable("The task queue is unavailable.", retry_after=5) from exc
    try:
        return async_result.get(timeout=settings.CHAT_RESULT_TIMEOUT, propagate=True)
    except CeleryTimeout:
        async_result.revoke()
        raise errors.WorkerUnavailable(retry_after=10) from None
    except errors.PlatformError:
        raise
    except Exception as exc:
        raise _remote_error(exc) from exc
    finally:
        async_result.forget()


def _remote_error(exc: Exception) -> errors.PlatformError:
    """Celery re-raises a worker's exception by class name; keep our family's status codes."""
    name = type(exc).__name__
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.PlatformError):
        return cls(str(exc) or None)
    return errors.GenerationFailed()
