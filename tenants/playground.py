"""Web side of the admin playground: ask the GPU workers for both replies, by task name.

Two tasks (personalised, plain) are enqueued at once, so two workers answer in parallel.
:func:`compare` waits for both (the page without JavaScript); :func:`start` enqueues them
streaming (each task publishes its pieces under its own id), :func:`events` relays one of
them as server-sent events and :func:`collect` gathers both results. Nothing here
imports ``gpu_worker``: tasks are sent by name and relayed through ``tenants.ports``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings

from tenants import ports, sealing
from tenants.errors import WorkerUnavailable
from tenants.faults import outage

PLAYGROUND_TASK = "gpu_worker.tasks.playground"
VARIANTS = ("personalised", "plain")


def _send(member_id: int, message: str, variant: str, preference_text: str | None,
          alpha: float | None, task_id: str | None = None, contrast: float | None = None):
    """Enqueue one reply; the texts sealed for its task id (``tenants.sealing``)."""
    from config.celery import app

    kwargs = {"alpha": alpha, "stream": bool(task_id)}
    if contrast is not None:  # sent only when set (None: the tenant's, else the model's)
        kwargs["contrast"] = contrast
    task_id = task_id or uuid.uuid4().hex
    turn = sealing.seal(sealing.PLAYGROUND_TURN, task_id,
                        {"message": message, "preference_text": preference_text})
    return app.send_task(PLAYGROUND_TASK, args=(member_id, turn, variant), kwargs=kwargs,
                         task_id=task_id)


def _wait(async_result, timeout: float, forget: bool = True) -> dict[str, Any]:
    try:
        sealed = async_result.get(timeout=timeout, propagate=True)
        return sealing.open_sealed(sealing.PLAYGROUND_RESULT, async_result.id, sealed)
    except Exception as exc:  # shown next to the other reply; the page never crashes
        name = type(exc).__name__
        service = outage(exc)
        text = (f"The {service} is unavailable." if service
                else "No worker answered in time." if name == "TimeoutError"
                else getattr(exc, "message", None) or str(exc) or f"The worker failed ({name}).")
        return {"error": text}
    finally:
        try:
            if forget:
                async_result.forget()
        except Exception:  # noqa: S110 (cleanup only; Redis may be down)
            pass


def compare(member_id: int, message: str, *, preference_text: str | None = None,
            alpha: float | None = None, timeout: float | None = None,
            contrast: float | None = None) -> dict[str, dict]:
    """Both replies for ``member_id``: ``{"personalised": {...}, "plain": {...}}``; a failed
    side carries ``{"error": "..."}``. ``preference_text``: an unsaved edit (never cached)."""
    timeout = settings.CHAT_RESULT_TIMEOUT if timeout is None else timeout
    try:
        pending = {v: _send(member_id, message, v, preference_text, alpha, contrast=contrast)
                   for v in VARIANTS}
    except Exception as exc:  # broker down
        raise WorkerUnavailable("The task queue is unavailable.", retry_after=5) from exc
    return {variant: _wait(result, timeout) for variant, result in pending.items()}


def start(member_id: int, message: str, *, preference_text: str | None = None,
          alpha: float | None = None, contrast: float | None = None) -> dict[str, str]:
    """Enqueue both replies streaming; returns ``{variant: task id}`` (random ids)."""
    ids = {variant: uuid.uuid4().hex for variant in VARIANTS}
    try:
        for variant, task_id in ids.items():
            _send(member_id, message, variant, preference_text, alpha, task_id, contrast)
    except Exception as exc:  # broker down
        raise WorkerUnavailable("The task queue is unavailable.", retry_after=5) from exc
    return ids


def result(task_id: str, timeout: float, forget: bool = False) -> dict[str, Any]:
    """One task's reply, or ``{"error": ...}`` (never raises); kept in the result backend
    for :func:`collect` unless ``forget``."""
    from celery.result import AsyncResult

    from config.celery import app

    return _wait(AsyncResult(task_id, app=app), timeout, forget)


def collect(task_ids: dict[str, str], timeout: float) -> dict[str, dict]:
    """Both results (then forgotten); a reply still running after ``timeout`` is an error."""
    return {variant: result(task_id, timeout, forget=True)
            for variant, task_id in task_ids.items()}


async def events(task_id: str) -> AsyncIterator[bytes]:
    """One reply as server-sent events: ``delta`` (JSON text) pieces, then ``done`` (the
    reply's result, authoritative: it replaces what the pieces showed)."""
    def sse(event: str, data: Any) -> bytes:
        return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()

    relay = ports.task_events(task_id, settings.CHAT_RESULT_TIMEOUT, result)
    try:
        async for kind, value in relay:
            yield sse(kind, value)
    finally:
        await relay.aclose()
