"""Web side: claim a chat's idempotency key, dispatch it to the GPU workers, wait.

Exactly once (tenants.actions.exchanges): the claim in Postgres decides whether a reply is
stored; whenever the web stops waiting it abandons the claim, so a late worker cannot
store a reply the client was told failed, and a retry with the same key replays it. It
also flags the request cancelled, so the worker stops generating for nobody; whatever
was generated is billed (``do_record_cancelled`` / ``do_record_discarded``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, NamedTuple

from celery.exceptions import Reject
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult
from django.conf import settings

from gpu_worker.channels import streams
from gpu_worker.errors import RedeliveryLimitExceeded
from gpu_worker.ops import metrics
from gpu_worker.routing.affinity import Route, check_capacity, choose_queue
from tenants import actions, errors, sealing
from tenants.budgets import estimate, ledger
from tenants.faults import outage

log = logging.getLogger(__name__)


class Dispatched(NamedTuple):
    result: AsyncResult
    route: Route


def chat_args(member_id: int, conversation_id: int | None, message: str, params: dict,
              request_id: str) -> tuple:
    """The chat task's arguments: ids in the clear, the member's text (the message, and
    the parameters: a ``/v1`` history, its ``user``, stop strings) sealed for this request
    (``tenants.sealing``: the broker never holds them readable)."""
    turn = sealing.seal(sealing.CHAT_TURN, request_id, {"message": message, "params": params})
    return (member_id, conversation_id, turn, request_id, time.time())


def dispatch_chat(
    member_id: int, conversation_id: int | None, message: str, params: dict, request_id: str
) -> Dispatched:
    """Enqueue one chat turn (on the member's worker queue when routing allows)."""
    from gpu_worker.tasks import chat

    route = choose_queue(member_id)
    try:
        async_result = chat.apply_async(
            args=chat_args(member_id, conversation_id, message, params, request_id),
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
    lend_back_connection()
    try:
        sealed = async_result.get(timeout=timeout, propagate=True)
        result = sealing.open_sealed(sealing.CHAT_RESULT, async_result.id, sealed)
        outcome = "ok"
        return result
    except CeleryTimeout:
        outcome = "timeout"
        raise errors.WorkerUnavailable(retry_after=10) from None
    except errors.PlatformError:
        raise
    except Exception as exc:
        service = outage(exc)  # Redis (results) here, or Postgres on the worker's side
        if service is None:
            raise _remote_error(exc) from exc
        outcome = "backend_down"
        raise errors.WorkerUnavailable(f"The {service} is unavailable.", retry_after=5) from exc
    finally:
        _forget(async_result)
        metrics.CHAT_REQUESTS.labels(outcome).inc()


def lend_back_connection() -> None:
    """A pooled connection (the web under ASGI, ``DB_POOL``) goes back to its pool while the
    request waits for a worker: a blocking chat would otherwise hold one of
    ``DB_POOL_MAX_SIZE`` for its whole generation, and the next request past that many
    would wait ``DB_POOL_TIMEOUT`` and fail. The next query takes one again. Inside a
    transaction (or unpooled) the connection stays."""
    from django.db import connection

    if connection.settings_dict.get("OPTIONS", {}).get("pool") and not connection.in_atomic_block:
        connection.close()


def _forget(async_result: AsyncResult) -> None:
    """Drop the stored result; never raise over the answer (Redis may be down)."""
    try:
        async_result.forget()
    except Exception as exc:  # cleanup only
        log.warning("could not forget result %s: %r", async_result.id, exc)


class ChatOutcome(NamedTuple):
    body: dict[str, Any]  # the API response body
    replayed: bool  # the stored answer of an earlier request with the same key


def claim_chat(member, conversation_id: int | None, message: str, params: dict,
               key: str | None = None, request_id: str | None = None) -> actions.Claim:
    """Claim the idempotency key (default: the request id) for a new attempt
    ``request_id`` (default: a fresh one; the web passes its ``x-request-id``), within
    the token budgets (tenants.budgets: BudgetExceeded, or ``params["max_new_tokens"]``
    lowered to what the budgets still hold)."""
    check_capacity()
    request_id = request_id or uuid.uuid4().hex
    asked = actions.request_hash(message, conversation_id, params)
    wanted = params.get("max_new_tokens")  # None: until the model stops
    prompt = estimate.prompt_estimate(member, conversation_id, message, params)
    claim, granted = actions.do_claim_chat_within_budget(
        member, key or request_id, request_id, asked, settings.CHAT_RESULT_TIMEOUT,
        prompt_tokens=prompt, max_new_tokens=wanted or estimate.room_after(prompt))
    if granted is not None and (wanted is None or granted < wanted):
        params["max_new_tokens"] = granted  # what the budgets hold: the reply ends "length"
    return claim


def run_chat(member, conversation_id: int | None, message: str, params: dict,
             key: str | None = None, request_id: str | None = None) -> ChatOutcome:
    """One chat turn end to end, exactly once per key: generated, or replayed if stored."""
    claim = claim_chat(member, conversation_id, message, params, key, request_id)
    if claim.replay is not None:
        metrics.CHAT_REQUESTS.labels("replayed").inc()
        return ChatOutcome(claim.replay, True)
    started = time.monotonic()
    try:
        result = _run_claimed(member, conversation_id, message, params, claim.request_id,
                              key or claim.request_id)
    finally:
        metrics.CHAT_SECONDS.observe(time.monotonic() - started)
    result.pop("worker", None)  # internal: which worker served it
    return ChatOutcome(result, False)


def _run_claimed(member, conversation_id, message, params, request_id, key) -> dict[str, Any]:
    try:
        dispatched = dispatch_chat(member.pk, conversation_id, message, params, request_id)
    except errors.PlatformError as exc:
        return stopped_waiting(member, request_id, key, exc)
    return finish_chat(member, dispatched, request_id, key)


def finish_chat(member, dispatched: Dispatched, request_id: str, key: str,
                timeout: float | None = None) -> dict[str, Any]:
    """Wait for a dispatched chat's result (the authoritative answer)."""
    try:
        return wait_chat(dispatched, timeout)
    except errors.PlatformError as exc:
        return stopped_waiting(member, request_id, key, exc, running=True)


def stopped_waiting(member, request_id: str, key: str, exc: errors.PlatformError, *,
                    running: bool = False) -> dict:
    """We stop waiting: no worker may store it now, unless one already has (its answer).
    ``running``: it was dispatched, so a worker may be generating it for nobody: its
    cancel flag stops it within a few tokens (what it generated is billed)."""
    stored = actions.do_abandon_chat(member, request_id, reason=exc.code, dispatched=running)
    if stored is not None:
        return stored
    if running:
        streams.flag_cancelled(request_id)
    if isinstance(exc, errors.BudgetExceeded):  # the worker's, on the real prompt
        exc.details.setdefault("retry_after", ledger.retry_after(member))
    if isinstance(exc, errors.WorkerUnavailable):
        exc.details.setdefault("retry_after", 5)
        exc.details["idempotency_key"] = key  # retry with it: exactly once
    raise exc


def _remote_error(exc: Exception) -> errors.PlatformError:
    """Celery re-raises a worker's exception by class name; keep our family's status codes."""
    if isinstance(exc, RedeliveryLimitExceeded):
        return errors.GenerationFailed(str(exc))
    if isinstance(exc, Reject):  # gpu_worker.ops.taskauth refused the message unrun
        return errors.SealedPayloadRejected(
            "A worker refused the request's task message: it is not signed with the "
            "worker's KV_SIGNING_SECRET (the secret differs or was rotated since); nothing "
            "was run. Retry the request.")
    if type(exc).__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded"):
        return errors.GenerationFailed("The model did not answer within the time limit.")
    name = type(exc).__name__
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.PlatformError):
        return cls(str(exc) or None)
    return errors.GenerationFailed()
