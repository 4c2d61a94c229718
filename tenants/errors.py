"""The project's error family: what actions, workers and views raise on purpose.

Each carries its HTTP status and code; ``tenants.api.exceptions`` is the one place that
turns them into responses (``{"error": {"code": "...", "message": "...", ...}}``).
"""

from __future__ import annotations

from typing import Any


class PlatformError(Exception):
    """Base of every error the platform raises on purpose."""

    status = 400
    code = "bad_request"
    default_message = "Bad request."

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or self.default_message
        self.details = details
        super().__init__(self.message)


class InvalidInput(PlatformError):
    status, code, default_message = 400, "invalid_input", "Invalid input."


class NotAuthenticated(PlatformError):
    status, code, default_message = 401, "not_authenticated", "Authentication required."


class Forbidden(PlatformError):
    status, code, default_message = 403, "forbidden", "Not allowed."


class InactiveAccount(PlatformError):
    status, code, default_message = 403, "inactive", "This account or tenant is inactive."


class NotFound(PlatformError):
    # Used for foreign ids too: 404, never 403, so other tenants' ids are not confirmed.
    status, code, default_message = 404, "not_found", "Not found."


class ModelNotFound(NotFound):
    code, default_message = "model_not_found", "The model does not exist."


class Conflict(PlatformError):
    status, code, default_message = 409, "conflict", "Already exists."


class ContextLengthExceeded(PlatformError):
    # Same class name as injection.errors.ContextLengthExceeded: a worker's error maps here.
    status, code = 400, "context_length_exceeded"
    default_message = "The message does not fit the model's context, even without history."


class ChatInProgress(Conflict):
    # A retry whose Idempotency-Key is still being answered by an earlier request.
    code, default_message = "chat_in_progress", "A request with this Idempotency-Key is running."


class IdempotencyKeyReused(PlatformError):
    status, code, default_message = (
        422, "idempotency_key_reused",
        "This Idempotency-Key was used for a different request.",
    )


class InvalidPeriod(PlatformError):
    # Well-formed dates that make no period (reversed, or too long): 422, not a 400.
    status, code, default_message = 422, "invalid_period", "That period cannot be reported."


class PayloadTooLarge(PlatformError):
    status, code, default_message = 413, "payload_too_large", "The request body is too large."


class Throttled(PlatformError):
    status, code, default_message = 429, "throttled", "Too many requests."


class BudgetExceeded(PlatformError):
    # A token budget (tenants.budgets) is spent: ``retry_after`` = seconds until it resets.
    # /v1 answers it as OpenAI's quota error (type ``insufficient_quota``).
    status, code, default_message = 429, "budget_exceeded", "The token budget is spent."


class WorkerUnavailable(PlatformError):
    status, code, default_message = 503, "worker_unavailable", "No worker answered in time."


class Overloaded(WorkerUnavailable):
    # CHAT_MAX_QUEUED tasks already wait for a worker: refused before anything is claimed.
    code, default_message = "overloaded", "The model workers are saturated; retry later."


class EngineUnavailable(WorkerUnavailable):
    # Same class name as injection.errors.EngineUnavailable: a worker's engine stopped or its
    # watchdog found it stuck; the request was not answered and the worker restarts.
    code = "engine_unavailable"
    default_message = "The model engine restarted while answering; retry the request."


class ChatAbandoned(WorkerUnavailable):
    """Raised by a worker: the request passed its deadline or the web gave up on it."""

    default_message = "The request was abandoned before its answer was stored."


class SealedPayloadRejected(WorkerUnavailable):
    # A task message, result or stream piece whose sealed text (tenants.sealing) does not
    # open here: sealed under another KV_SIGNING_SECRET (a rotation) or altered. Nothing is
    # run or relayed from it; retrying once web and workers share the secret succeeds.
    code = "sealed_payload_rejected"
    default_message = "The request could not be opened by the worker; nothing was run."


class ServiceUnavailable(PlatformError):
    """Postgres, Redis or the task queue cannot be reached (see tenants.faults)."""

    status, code, default_message = 503, "service_unavailable", "A backing service is down."


class GenerationFailed(PlatformError):
    status, code, default_message = 502, "generation_failed", "The model failed to answer."
