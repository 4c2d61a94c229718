"""Member text sealed for its trip through Redis: task arguments, results, stream pieces.

The broker Redis keeps an append-only file, so whatever a task message, a task result or a
reply's stream carries in the clear lands on its disk. What of a chat is member text (the
message, a ``/v1`` request's history and parameters, the reply, the streamed pieces; the
admin playground's message, unsaved preference text and replies) is sealed here with
AES-256-GCM before it is written to Redis and opened after it is read:

* the key is derived (HKDF-SHA256, its own ``info``) from ``KV_SIGNING_SECRET``, which web
  and workers share from their environment and Redis never holds; the task signature
  (``config.taskauth``) and the K/V MACs use other derivations of it;
* the associated data binds a box to its ``purpose`` and ``ident`` (the task name or the
  request id): a sealed message cannot be replayed as another request's, nor a result or a
  stream piece moved to another request;
* a box names its key by a short id (``kid``, a MAC of the key, not the key); it is sealed
  under ``KV_SIGNING_SECRET`` and opened under it or, while a rotation rolls out, under one
  of ``KV_SIGNING_SECRET_FALLBACKS``. A box that does not open (sealed under a secret no
  longer accepted, or altered) fails closed with ``SealedPayloadRejected``: nothing is run
  or relayed from it.

Why sealing and not "ids only" (the turn stored in Postgres before the task is sent):
``/v1`` is stateless, its history comes with each request and is stored only with the
reply; the result and the stream pieces carry the reply as well. Sealing covers all three
with one rule and no new table.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from functools import lru_cache
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from tenants.errors import SealedPayloadRejected

__all__ = ["CHAT_RESULT", "CHAT_TURN", "PLAYGROUND_RESULT", "PLAYGROUND_TURN", "STREAM_PIECE",
           "key_id", "open_bytes", "open_sealed", "seal", "seal_bytes"]

VERSION = "1"
_INFO = b"kvinject sealed redis payload v1"
_NONCE = 12  # bytes: AES-GCM's standard nonce, random per box
# what a box is for (its associated data, with the request id)
CHAT_TURN, CHAT_RESULT, STREAM_PIECE = "chat.turn", "chat.result", "stream.piece"
PLAYGROUND_TURN, PLAYGROUND_RESULT = "playground.turn", "playground.result"


@lru_cache(maxsize=4)
def _derive(secret: str) -> tuple[AESGCM, str]:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(
        secret.encode())
    return AESGCM(key), hmac.new(key, b"key id", hashlib.sha256).hexdigest()[:12]


def _accepted() -> dict[str, AESGCM]:
    """The keys a box may open under, by id: the current secret's and its fallbacks'."""
    secrets = (settings.KV_SIGNING_SECRET,
               *getattr(settings, "KV_SIGNING_SECRET_FALLBACKS", ()))
    return {kid: aead for aead, kid in (_derive(s) for s in secrets if s)}


def key_id() -> str:
    """The id boxes sealed now carry (changes with ``KV_SIGNING_SECRET``)."""
    return _derive(settings.KV_SIGNING_SECRET)[1]


def _aad(purpose: str, ident: str) -> bytes:
    return b"\0".join((b"kvi-seal", VERSION.encode(), purpose.encode(), str(ident).encode()))


def seal_bytes(purpose: str, ident: str, data: bytes) -> str:
    """``data`` as a box: ``"<version>.<kid>.<base64 of nonce + ciphertext + tag>"``."""
    aead, kid = _derive(settings.KV_SIGNING_SECRET)
    nonce = os.urandom(_NONCE)
    sealed = aead.encrypt(nonce, data, _aad(purpose, ident))
    return f"{VERSION}.{kid}.{base64.b64encode(nonce + sealed).decode()}"


def open_bytes(purpose: str, ident: str, box: Any) -> bytes:
    """The bytes sealed in ``box`` for (``purpose``, ``ident``); SealedPayloadRejected when
    it is not such a box, was sealed under another key, or was altered."""
    if isinstance(box, bytes):
        box = box.decode("ascii", "replace")
    parts = box.split(".") if isinstance(box, str) else []
    if len(parts) != 3 or parts[0] != VERSION:
        raise SealedPayloadRejected("The request's sealed payload is missing or malformed; "
                                    "nothing was run.")
    aead = _accepted().get(parts[1])
    if aead is None:
        raise SealedPayloadRejected(
            "The request was sealed with a key this process does not hold (KV_SIGNING_SECRET "
            "differs, or was rotated and the old one is no longer accepted); nothing was run. "
            "Retry the request.")
    try:
        raw = base64.b64decode(parts[2], validate=True)
        return aead.decrypt(raw[:_NONCE], raw[_NONCE:], _aad(purpose, ident))
    except (InvalidTag, ValueError, binascii.Error):
        raise SealedPayloadRejected("The request's sealed payload failed authentication "
                                    "(altered, or sealed for another request); nothing was "
                                    "run.") from None


def seal(purpose: str, ident: str, value: Any) -> str:
    """A JSON value sealed (``open_sealed`` gives it back)."""
    return seal_bytes(purpose, ident, json.dumps(value, separators=(",", ":")).encode())


def open_sealed(purpose: str, ident: str, box: Any) -> Any:
    return json.loads(open_bytes(purpose, ident, box))
