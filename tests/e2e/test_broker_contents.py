"""Members' words never sit readable in the broker Redis, in memory or on its disk.

Chats through the real path (uvicorn -> Redis broker -> real Celery worker -> Redis results
and streams): ``/api/chat``, ``/v1`` with a history, a ``/v1`` stream, and the admin
playground's two replies. Their message, history, ``user`` and stop strings carry a marker
unique to this run; the member's preference (and the playground's unsaved edit) another. Afterwards neither marker (nor a reply) is in any value of
the broker db (strings, lists, hashes, sets, streams; base64 bodies decoded) nor in the
broker's append-only file, which holds every write ever made, deleted keys included
(tenants.sealing: task arguments, results and stream pieces are sealed).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tenants import actions, playground
from tests.e2e.chat_http import post
from tests.workers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
MARK = "quokka" + uuid.uuid4().hex[:12]  # in the member's messages and parameters
PREF = "wombat" + uuid.uuid4().hex[:12]  # in the member's preference


def encodings(marker: str) -> list[bytes]:
    """The marker, and what any base64 text that encodes it must contain (each of the
    three alignments, without the characters its neighbours share)."""
    raw, found = marker.encode(), [marker.encode()]
    for shift in range(3):
        enc = base64.b64encode(b"\0" * shift + raw)
        start = (shift * 8 + 5) // 6 + (1 if shift else 0)
        found.append(enc[start:len(enc) - 4].rstrip(b"="))
    return found


def leaks(blob: bytes, secrets: list[str]) -> list[str]:
    return [s for s in secrets if any(e and e in blob for e in encodings(s))]


def values(client: redis.Redis):
    """Every value of every key on the db, as bytes."""
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            yield key, client.get(key) or b""
        elif kind == "list":
            yield key, b"\n".join(client.lrange(key, 0, -1))
        elif kind == "hash":
            yield key, b"\n".join(k + b"=" + v for k, v in client.hgetall(key).items())
        elif kind in ("set", "zset"):
            yield key, b"\n".join(client.smembers(key) if kind == "set"
                                  else client.zrange(key, 0, -1))
        elif kind == "stream":
            yield key, json.dumps([[i.decode(), {k.decode(): v.decode("latin-1")
                                                 for k, v in f.items()}]
                                   for i, f in client.xrange(key)]).encode()


def data_files(client: redis.Redis) -> list[Path]:
    """The server's own persistence files (its ``dir``: AOF and RDB), flushed up to a
    sentinel written now."""
    sentinel = "sentinel-" + uuid.uuid4().hex
    client.set(f"kvi:test:{sentinel}", sentinel, ex=60)
    folder = Path(client.config_get("dir")["dir"])
    assert folder.is_dir(), f"the broker's data dir {folder} is not on this machine"

    def flushed():
        files = [p for p in folder.rglob("*") if p.is_file() and (
            ".aof" in p.name or p.suffix == ".rdb")]
        return files if any(sentinel.encode() in p.read_bytes() for p in files) else None

    return wait_for(flushed, 30, "the sentinel in the broker's append-only file")


def v1(base: str, token: str, body: dict) -> bytes:
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {token}",
                                                         "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=180) as resp:
        assert resp.status == 200
        return resp.read()


def chat_every_way(base: str, token: str) -> list[str]:
    """/api/chat, /v1 (history, user, stop) and a /v1 stream; returns their replies."""
    status, body = post(base, "/api/chat", token, {
        "message": f"Plan dinner for {MARK} please.", "max_new_tokens": 24})
    assert status == 200, body
    replies = [body["reply"]]
    history = [{"role": "user", "content": f"I am {MARK}-h1."},
               {"role": "assistant", "content": f"Hello {MARK}-h2."},
               {"role": "user", "content": f"What about {MARK}-now?"}]
    common = {"model": "kvinject", "messages": history, "max_tokens": 24,
              "user": f"{MARK}-user", "stop": [f"{MARK}-stop"]}
    replies.append(json.loads(v1(base, token, common))["choices"][0]["message"]["content"])
    streamed = v1(base, token, {**common, "stream": True}).decode()
    chunks = [json.loads(line[6:]) for line in streamed.splitlines()
              if line.startswith("data: {")]
    replies.append("".join(c["choices"][0]["delta"].get("content") or ""
                           for c in chunks if c.get("choices")))
    assert streamed.rstrip().endswith("data: [DONE]") and replies[-1]
    return replies


def test_member_text_is_nowhere_in_the_broker(asgi_server, gpu_worker):
    tenant = actions.do_create_tenant("sealed")
    member = actions.do_add_member(tenant, "alice", preference=f"I am vegetarian, {PREF}.")
    replies = chat_every_way(asgi_server.url, actions.do_create_api_token(member))
    # the admin playground's web side: a message and an unsaved preference edit
    both = playground.compare(member.pk, f"Try {MARK} here.", preference_text=f"{PREF} now")
    replies += [both[v]["reply"] for v in playground.VARIANTS]
    secrets = [MARK, PREF] + [re.sub(r"\s+", " ", r).strip()[:32] for r in replies
                              if len(re.sub(r"\s", "", r)) >= 16]  # long enough to be unique
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        keys = 0
        for key, blob in values(client):
            keys += 1
            assert not leaks(blob, secrets), f"member text in broker key {key!r}"
        assert keys > 0  # the scan saw the broker's keys (queues, results, heartbeats)
        for path in data_files(client):
            assert not leaks(path.read_bytes(), secrets), f"member text in {path}"
    finally:
        client.close()
