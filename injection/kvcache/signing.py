"""HMAC-signed Redis key names and per-tenant MACs for the L2 tier.

Every name and MAC derives from one server secret and a ``key_generation``:

* ``tenant_key = HMAC-SHA256(secret, "tenant:" + generation + ":" + tenant)``
* tenant tag   = ``HMAC(tenant_key, "tag")`` (hex, 128 bit): the only tenant
  identity that reaches Redis, so slugs never appear there and a SCAN by
  ``tenant_prefix`` selects exactly one tenant;
* entry key    = ``{ns}:{tag}:e:{HMAC(tenant_key, tenant|user|hash|fingerprint|version)}``;
* user index   = ``{ns}:{tag}:u:{HMAC(tenant_key, "user|" + user)}`` (a SET of
  that user's entry keys, so one user is evicted without SCAN);
* conversation index = ``{ns}:{tag}:u:{HMAC(tenant_key, "conversation|" + user + "|" + id)}``
  (a SET of one stored conversation's link names, also in the user's index: deleting the
  conversation drops exactly its links);
* seen mark    = ``{ns}:{tag}:s:{the entry's digest}``: a conversation key looked up
  before (the admission doorkeeper of ``injection.kvcache.conversation``);
* link ledger  = ``{ns}:{tag}:l:{HMAC(tenant_key, "links")}`` (a HASH: each conversation
  link's bytes and user index, and the tenant's total) and ``{ns}:{tag}:o:{...}`` (a ZSET: the links in
  the order they were written), the tenant's link budget (``injection.kvcache.l2.links``);
* MAC key      = ``HMAC(secret, "mac:" + generation + ":" + tag)``: derivable
  from an entry's Redis name, so ``verify`` can audit entries of every tenant
  without knowing tenant names.

Without the secret no key can be guessed or constructed and no value forged.
Changing the secret or generation makes all old entries unreachable (other
names) and unverifiable (other MAC keys).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from functools import lru_cache

__all__ = ["CacheKeySigner", "L2_FORMAT_VERSION", "MAC_SIZE"]

# Version of the L2 value format (``injection.kvcache.codec``); part of every entry name,
# so a new format never reads old entries.
L2_FORMAT_VERSION = 1

_NS_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_TAG_RE = re.compile(r"^[0-9a-f]{32}$")
# {ns}:{tag}:{e|u|l|o|s}:{digest}: an entry, a user index, a tenant's link ledger (its
# sizes and its order) or a seen mark, of any key generation
_NAME_RE = re.compile(r"^([A-Za-z0-9_.-]{1,32}):([0-9a-f]{32}):([eulos]):[0-9a-f]{64}$")
MAC_SIZE = 32


def _hmac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of length-prefixed parts (no separator ambiguity)."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.digest()


def _b(s: str) -> bytes:
    return s.encode("utf-8")


class CacheKeySigner:
    """Derives Redis names and value MACs from a server secret.

    Args:
        secret: server secret (str or bytes, at least 16 bytes).
        key_generation: bump to invalidate every entry (``rotate-key``); no ``:``.
        namespace: first component of every Redis name (``[A-Za-z0-9_.-]``).
    """

    def __init__(
        self, secret: bytes | str, *, key_generation: str = "0", namespace: str = "kvi"
    ) -> None:
        secret_b = _b(secret) if isinstance(secret, str) else bytes(secret)
        if len(secret_b) < 16:
            raise ValueError("CacheKeySigner secret must be at least 16 bytes")
        if not key_generation or ":" in key_generation:
            raise ValueError("key_generation must be non-empty and contain no ':'")
        if not _NS_RE.match(namespace):
            raise ValueError(f"namespace must match {_NS_RE.pattern}, got {namespace!r}")
        self._secret = secret_b
        self.key_generation = key_generation
        self.namespace = namespace
        # Bound per instance: derived keys never outlive the signer.
        self._tenant_key = lru_cache(maxsize=4096)(self._derive_tenant_key)
        self._mac_key = lru_cache(maxsize=4096)(self._derive_mac_key)

    def with_namespace(self, namespace: str) -> CacheKeySigner:
        """The same secret and generation under another namespace (self if equal)."""
        if namespace == self.namespace:
            return self
        return CacheKeySigner(self._secret, key_generation=self.key_generation, namespace=namespace)

    # -- derivation ---------------------------------------------------------------
    def _derive_tenant_key(self, tenant: str) -> bytes:
        return _hmac(self._secret, _b(f"tenant:{self.key_generation}:{tenant}"))

    def _derive_mac_key(self, tag: str) -> bytes:
        return _hmac(self._secret, _b(f"mac:{self.key_generation}:{tag}"))

    def tenant_tag(self, tenant: str) -> str:
        """Opaque 32-hex tag standing for ``tenant`` in Redis names."""
        if not tenant:
            raise ValueError("tenant must be non-empty")
        return _hmac(self._tenant_key(tenant), b"tag")[:16].hex()

    # -- names --------------------------------------------------------------------
    def tenant_prefix(self, tenant: str) -> str:
        """Prefix of every Redis name of ``tenant`` (entries and user indexes)."""
        return f"{self.namespace}:{self.tenant_tag(tenant)}:"

    def redis_key(self, key: tuple[str, str, str, str]) -> str:
        """Redis name of one entry (a :class:`~injection.base.CacheKey`)."""
        tenant, user, content_hash, fingerprint = key
        if not user:
            raise ValueError("user must be non-empty (anonymous requests are never cached)")
        digest = _hmac(
            self._tenant_key(tenant),
            *(_b(x) for x in (tenant, user, content_hash, fingerprint)),
            _b(str(L2_FORMAT_VERSION)),
        )
        return f"{self.tenant_prefix(tenant)}e:{digest.hex()}"

    def user_index_key(self, tenant: str, user: str) -> str:
        """Redis SET holding the entry names of one user."""
        digest = _hmac(self._tenant_key(tenant), b"user", _b(user))
        return f"{self.tenant_prefix(tenant)}u:{digest.hex()}"

    def conversation_index_key(self, tenant: str, user: str, conversation: str) -> str:
        """Redis SET holding the link names of one stored conversation of ``user``."""
        digest = _hmac(self._tenant_key(tenant), b"conversation", _b(user), _b(conversation))
        return f"{self.tenant_prefix(tenant)}u:{digest.hex()}"

    def seen_key(self, key: tuple[str, str, str, str]) -> str:
        """Redis name of the mark that ``key`` was looked up (no data: ``b"1"``)."""
        entry = self.redis_key(key)
        return entry[: -(64 + 3)] + "s:" + entry[-64:]

    def link_ledger_keys(self, tenant: str) -> tuple[str, str]:
        """The tenant's link ledger: a HASH (link name -> "bytes user-index", and the total)
        and a ZSET (link name -> when it was written)."""
        prefix, key = self.tenant_prefix(tenant), self._tenant_key(tenant)
        return (f"{prefix}l:{_hmac(key, b'links', b'bytes').hex()}",
                f"{prefix}o:{_hmac(key, b'links', b'order').hex()}")

    def entry_ledger_keys(self, tenant: str) -> tuple[str, str]:
        """The tenant's ledger of its other entries (segments, leans): as the links'."""
        prefix, key = self.tenant_prefix(tenant), self._tenant_key(tenant)
        return (f"{prefix}l:{_hmac(key, b'entries', b'bytes').hex()}",
                f"{prefix}o:{_hmac(key, b'entries', b'order').hex()}")

    def entry_match(self, tenant: str | None = None) -> str:
        """SCAN MATCH pattern for entry names of ``tenant`` (or of every tenant)."""
        if tenant is None:
            return f"{self.namespace}:*:e:*"
        return f"{self.tenant_prefix(tenant)}e:*"

    def tag_of(self, redis_key: str | bytes) -> str:
        """Tenant tag of a Redis name of this namespace; ValueError if malformed."""
        name = redis_key.decode() if isinstance(redis_key, bytes) else redis_key
        parts = name.split(":")
        if len(parts) != 4 or parts[0] != self.namespace or not _TAG_RE.match(parts[1]):
            raise ValueError(f"not an entry name of namespace {self.namespace!r}")
        return parts[1]

    def parse_name(self, name: str | bytes) -> tuple[str, str] | None:
        """``(tenant tag, kind)`` for an entry (``e``), user index (``u``), link ledger
        (``l``, ``o``) or seen mark (``s``) of this namespace, whatever its key generation;
        None for any other name."""
        text = name.decode(errors="replace") if isinstance(name, bytes) else name
        m = _NAME_RE.match(text)
        if m is None or m.group(1) != self.namespace:
            return None
        return m.group(2), m.group(3)

    # -- MACs ---------------------------------------------------------------------
    def mac(self, tenant: str, data: bytes) -> bytes:
        """HMAC-SHA256 of ``data`` under ``tenant``'s MAC key."""
        return self.mac_parts(self.tenant_tag(tenant), (data,))

    def verify(self, tenant: str, data: bytes, tag: bytes) -> bool:
        """Constant-time check of ``tag`` against :meth:`mac`."""
        return hmac.compare_digest(self.mac(tenant, data), tag)

    def mac_parts(self, tenant_tag: str, parts: tuple[bytes | memoryview, ...]) -> bytes:
        """HMAC over the concatenation of ``parts`` (streamed, no join) for a tenant tag."""
        h = hmac.new(self._mac_key(tenant_tag), digestmod=hashlib.sha256)
        for p in parts:
            h.update(p)
        return h.digest()
