"""Web side of the admin playground: ask the GPU workers for both replies, by task name.

Two tasks (personalised, plain) are enqueued at once, so two workers answer in parallel;
the page shows both when both are done (not streamed). Nothing here imports
``gpu_worker``: the task is sent by name (``tenants.ports`` rule).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from tenants.errors import WorkerUnavailable
from tenants.faults import outage

PLAYGROUND_TASK = "gpu_worker.tasks.playground"
VARIANTS = ("personalised", "plain")


def _send(member_id: int, message: str, variant: str, preference_text: str | None,
          alpha: float | None):
    from config.celery import app

    return app.send_task(PLAYGROUND_TASK, args=(member_id, message, variant),
                         kwargs={"preference_text": preference_text, "alpha": alpha})


def _wait(async_result, timeout: float) -> dict[str, Any]:
    try:
        return async_result.get(timeout=timeout, propagate=True)
    except Exception as exc:  # shown next to the other reply; the page never crashes
        name = type(exc).__name__
        service = outage(exc)
        text = (f"The {service} is unavailable." if service
                else "No worker answered in time." if name == "TimeoutError"
                else getattr(exc, "message", None) or str(exc) or f"The worker failed ({name}).")
        return {"error": text}
    finally:
        try:
            async_result.forget()
        except Exception:  # noqa: S110 (cleanup only; Redis may be down)
            pass


def compare(member_id: int, message: str, *, preference_text: str | None = None,
            alpha: float | None = None, timeout: float | None = None) -> dict[str, dict]:
    """Both replies for ``member_id``: ``{"personalised": {...}, "plain": {...}}``; a failed
    side carries ``{"error": "..."}``. ``preference_text``: an unsaved edit (never cached)."""
    timeout = settings.CHAT_RESULT_TIMEOUT if timeout is None else timeout
    try:
        pending = {v: _send(member_id, message, v, preference_text, alpha) for v in VARIANTS}
    except Exception as exc:  # broker down
        raise WorkerUnavailable("The task queue is unavailable.", retry_after=5) from exc
    return {variant: _wait(result, timeout) for variant, result in pending.items()}
