"""Web side: dispatch a chat turn to the GPU workers and wait for the answer."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult
from django.conf import settings

from gpu_worker import metrics
from gpu_worker.errors import RedeliveryLimitExceeded
from gpu_worker.routing import Route, choose_queue
from tenants import errors


class Dispatched(NamedTuple):
    result: AsyncResult
    route: Route


def dispatch_chat(
    member_id: int, conversation_id: int | None, message: str, params: dict, request_id: str
) -> Dispatched:
    """Enqueue one chat turn (on the member's worker queue when routing allows)."""
    from gpu_worker.tasks import chat

    route = choose_queue(member_id)
    try:
        async_result = chat.apply_async(
            args=(member_id, conversation_id, message, params, request_id, time.time()),
            queue=route.queue,
            task_id=request_id,
        )
    except Exception as exc:  # broker down
        metrics.CHAT_REQUESTS.labels("broker_down").inc()
        raise errors.WorkerUnavailable("The task queue is unavailable.", retry_after=5) from exc
    metrics.CHAT_DISPATCH.labels(route.reason).inc()
    return Dispatched(async_result, route)


def wait_chat(dispatched: Dispatched, timeout: float | None = None) -> dict[str, Any]:
    """The worker's full result (including ``worker``), or a ``tenants.errors`` error."""
    async_result = dispatched.result
    timeout = settings.CHAT_RESULT_TIMEOUT if timeout is None else timeout
    outcome = "error"
    try:
        result = async_result.get(timeout=timeout, propagate=True)
        outcome = "ok"
        return result
    except CeleryTimeout:
        outcome = "timeout"
        async_result.revoke()
        raise errors.WorkerUnavailable(retry_after=10) from None
    except errors.PlatformError:
        raise
    except Exception as exc:
        raise _remote_error(exc) from exc
    finally:
        async_result.forget()
        metrics.CHAT_REQUESTS.labels(outcome).inc()


def run_chat(
    member_id: int, conversation_id: int | None, message: str, params: dict, request_id: str
) -> dict[str, Any]:
    """One chat turn end to end; returns the API response body."""
    started = time.monotonic()
    try:
        result = wait_chat(dispatch_chat(member_id, conversation_id, message, params, request_id))
    finally:
        metrics.CHAT_SECONDS.observe(time.monotonic() - started)
    result.pop("worker", None)  # internal: which worker served it
    return result


def _remote_error(exc: Exception) -> errors.PlatformError:
    """Celery re-raises a worker's exception by class name; keep our family's status codes."""
    if isinstance(exc, RedeliveryLimitExceeded):
        return errors.GenerationFailed(str(exc))
    if type(exc).__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded"):
        return errors.GenerationFailed("The model did not answer within the time limit.")
    name = type(exc).__name__
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.PlatformError):
        return cls(str(exc) or None)
    return errors.GenerationFailed()
