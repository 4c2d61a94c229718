"""Logging policy: no log line carries message or reply text (docs/OPERATIONS.md).

Celery logs task arguments and results in several places: the ``succeeded`` INFO line
prints the return value (our reply), and every line that prints a request with ``%r``
(cancel, revoke, failure paths) prints the ``argsrepr`` sent with the task. So:

* :class:`PrivateArgsTask` (the base of our tasks) sends an ``argsrepr``/``kwargsrepr``
  that keeps numbers and ids but replaces every string by its length, at every enqueue
  site (``apply_async``/``delay``);
* :class:`RedactTaskResults` (a filter on the ``celery.app.trace`` logger, installed by
  ``LOGGING`` in settings) replaces the return value and arguments in its records;
* :class:`RedactMessageBodies` (on ``celery.worker.consumer.consumer``) drops the raw
  message body Celery dumps when it discards a message it cannot run.

Nothing here imports Django: ``LOGGING`` loads it while settings are being configured.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

__all__ = ["PrivateArgsTask", "RedactMessageBodies", "RedactTaskResults", "redacted_repr"]

REDACTED = "<redacted>"


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return f"<str:{len(value)}>"
    if isinstance(value, dict):
        return {str(k): _redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return f"<{type(value).__name__}>"


def redacted_repr(value: Any) -> str:
    """A repr of task arguments without any text: strings become ``<str:LEN>``."""
    return repr(_redact(value if value is not None else ()))


class PrivateArgsTask(Task):
    """Task whose messages carry redacted ``argsrepr``/``kwargsrepr`` (what Celery logs)."""

    def apply_async(self, args=None, kwargs=None, task_id=None, producer=None, link=None,
                    link_error=None, shadow=None, **options):
        options.setdefault("argsrepr", redacted_repr(args))
        options.setdefault("kwargsrepr", redacted_repr(kwargs or {}))
        return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow,
                                   **options)


class RedactTaskResults(logging.Filter):
    """``celery.app.trace``: task results and arguments never reach a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):
            record.args = {**record.args, **{k: REDACTED for k in ("return_value", "args",
                                                                   "kwargs") if k in record.args}}
        data = getattr(record, "data", None)
        if isinstance(data, dict):
            record.data = {**data, **{k: REDACTED for k in ("args", "kwargs") if k in data}}
        return True


class RedactMessageBodies(logging.Filter):
    """``celery.worker.consumer.consumer``: a discarded message's body is not logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery.worker.consumer import consumer as c

        dumps_body = {c.UNKNOWN_FORMAT: "unknown format", c.UNKNOWN_TASK_ERROR: "unknown task",
                      c.INVALID_TASK_ERROR: "invalid task", c.MESSAGE_DECODE_ERROR: "undecodable"}
        if isinstance(record.msg, str) and record.msg in dumps_body:
            record.args = (dumps_body[record.msg],)
            record.msg = "discarded a task message (%s); its body is not logged"
        return True
