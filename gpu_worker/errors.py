"""Errors a GPU task fails with on purpose (returned to the caller through the result backend)."""

from __future__ import annotations


class RedeliveryLimitExceeded(Exception):
    """The task was delivered WORKER_MAX_DELIVERIES times and each worker died (poison)."""

    def __init__(self, message: str = "The request was abandoned: every worker that took it "
                                      "died while handling it.") -> None:
        super().__init__(message)
