"""SCAN-based maintenance of the L2 tier: batches of names, sizes, and verification.

Used by :class:`injection.kvcache.redis_tier.RedisKVTier` for ``verify``, ``evict`` of a
tenant and ``stats(scan=True)``; these raise ``redis.RedisError`` to their callers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:  # pragma: no cover
    from injection.kvcache.signing import CacheKeySigner

__all__ = ["batches", "sizes", "sizes_by_tag", "verify"]

SCAN_BATCH = 500
VERIFY_BATCH = 16  # values fetched per pipeline while verifying (bounded memory)


def batches(client: redis.Redis, match: str, batch: int = SCAN_BATCH) -> Iterator[list[bytes]]:
    """Yield lists of names matching ``match`` (SCAN, never KEYS)."""
    buf: list[bytes] = []
    for n in client.scan_iter(match=match, count=SCAN_BATCH):
        buf.append(n)
        if len(buf) >= batch:
            yield buf
            buf = []
    if buf:
        yield buf


def sizes(client: redis.Redis, match: str) -> dict[str, int]:
    """Number of names matching ``match`` and the bytes of their string values."""
    return sizes_by_tag(client, match, lambda _: "").get("", {"entries": 0, "bytes": 0})


def sizes_by_tag(client: redis.Redis, match: str, tag_of: Callable[[bytes], str]
                 ) -> dict[str, dict[str, int]]:
    """``sizes`` bucketed by ``tag_of(name)`` (a tenant's tag), in one SCAN pass."""
    out: dict[str, dict[str, int]] = {}
    for batch in batches(client, match):
        with client.pipeline(transaction=False) as p:
            for n in batch:
                p.strlen(n)
            lengths = p.execute(raise_on_error=False)
        for n, size in zip(batch, lengths, strict=True):
            row = out.setdefault(tag_of(n), {"entries": 0, "bytes": 0})
            row["entries"] += 1
            row["bytes"] += size if isinstance(size, int) else 0
    return out


def verify(client: redis.Redis, signer: CacheKeySigner, match: str) -> dict[str, Any]:
    """Check MAC + header of every entry matching ``match``; delete the bad ones
    (a name holding another Redis type included)."""
    report: dict[str, Any] = {"scanned": 0, "ok": 0, "bad": 0, "deleted": 0, "bad_keys": []}
    reasons: dict[str, str] = {}
    for batch in batches(client, match, VERIFY_BATCH):
        with client.pipeline(transaction=False) as p:
            for n in batch:
                p.get(n)
            blobs = p.execute(raise_on_error=False)
        for n, blob in zip(batch, blobs, strict=True):
            if blob is None:  # expired since SCAN
                continue
            report["scanned"] += 1
            problem = _problem(blob, n.decode(errors="replace"), signer)
            if problem is None:
                report["ok"] += 1
                continue
            report["bad"] += 1
            report["bad_keys"].append(n.decode(errors="replace"))
            reasons[n.decode(errors="replace")] = problem
            report["deleted"] += int(client.delete(n))
    report["reasons"] = reasons
    return report


def _problem(blob: Any, name: str, signer: CacheKeySigner) -> str | None:
    """Why the value is bad, or None when it verifies."""
    from injection.kvcache import codec  # needs torch: only when verifying

    try:
        if not isinstance(blob, bytes):
            raise codec.CorruptEntry(f"not a string value: {blob!r}"[:120])
        codec.check(blob, name, signer)
    except codec.CorruptEntry as e:
        return str(e)
    return None
