"""KV_SIGNING_SECRET and, during a rotation, the earlier secrets still accepted.

Every message one platform process authenticates for another (task messages, control
requests) is signed with the current secret alone and verified against the current one,
then each of ``KV_SIGNING_SECRET_FALLBACKS``: processes on either side of a rotation
understand each other while it rolls out (docs/OPERATIONS.md, "Rotating secrets").
"""

from __future__ import annotations

import hashlib
import hmac


def secrets_accepted() -> list[bytes]:
    """The current secret first, then the fallbacks (duplicates dropped)."""
    from django.conf import settings

    out: list[bytes] = []
    for s in (settings.KV_SIGNING_SECRET, *getattr(settings, "KV_SIGNING_SECRET_FALLBACKS", ())):
        b = s.encode()
        if b and b not in out:
            out.append(b)
    return out


def derived_keys(context: bytes) -> list[bytes]:
    """``HMAC(secret, context)`` for every accepted secret; the first is the signing key."""
    return [hmac.new(s, context, hashlib.sha256).digest() for s in secrets_accepted()]


def matches(keys: list[bytes], body: bytes, mac_hex: str) -> bool:
    """Whether ``mac_hex`` is the HMAC-SHA256 of ``body`` under any of ``keys``."""
    return any(hmac.compare_digest(hmac.new(k, body, hashlib.sha256).hexdigest(), mac_hex)
               for k in keys)
