"""Who is acting, for the audit log's ``actor_kind``: a member (API), an admin (the admin
site), an operator (CLI) or the system (workers, signals, anything else).

A context variable set per request by ``AuditOriginMiddleware`` and around management
commands by ``acting_as``; ``tenants.actions.base.audit`` stores it on every row. New
threads start with the default, so nothing leaks from one request to the next.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

MEMBER, ADMIN, CLI, SYSTEM = "member", "admin", "cli", "system"
KINDS = (MEMBER, ADMIN, CLI, SYSTEM)

_origin: contextvars.ContextVar[str] = contextvars.ContextVar("kvi_actor_kind", default=SYSTEM)


def current_kind() -> str:
    return _origin.get()


@contextmanager
def acting_as(kind: str) -> Iterator[None]:
    assert kind in KINDS, kind
    token = _origin.set(kind)
    try:
        yield
    finally:
        _origin.reset(token)


class AuditOriginMiddleware:
    """/admin/ requests act as "admin", /api/ requests as "member"."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info
        kind = ADMIN if path.startswith("/admin/") else MEMBER if path.startswith("/api/") \
            else current_kind()
        with acting_as(kind):
            return self.get_response(request)


class CliCommandMixin:
    """For management commands: everything they audit is recorded as done from the CLI."""

    def execute(self, *args, **options):
        with acting_as(CLI):
            return super().execute(*args, **options)
