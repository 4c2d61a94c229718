"""A streamed OpenAI-style ``/v1/chat/completions`` turn, as any client sends it: against the
platform or a peer server (bench/bench_vs_peer.py), and the pure helpers that read its result.

No Django, no torch: the peer's side of a benchmark runs with nothing of the platform loaded.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import urllib.error
import urllib.request


def post(url: str, body: dict, headers: dict[str, str], timeout: float = 600):
    """The open response of a JSON POST; an HTTP error is a ``SystemExit`` naming it."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{url} answered {exc.code}: {exc.read()[:400]!r}") from None


def stream(base: str, body: dict, headers: dict[str, str] | None = None) -> dict:
    """One streamed turn (``stream`` and ``include_usage`` set here): seconds to the first
    content chunk, the whole stream's seconds, the reply, its tokens, the decode rate after
    the first chunk, the prompt's tokens and those its server took from a cache, the
    platform's conversation id where it sends one, and the last usage object as sent."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, text, usage, conversation = None, [], {}, None
    with post(f"{base}/v1/chat/completions", body, headers or {}) as resp:
        for line in resp:
            data = line.decode().removeprefix("data: ").strip()
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise SystemExit(f"/v1 stream failed: {data[:400]}")
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    text.append(piece)
            usage = chunk.get("usage") or usage
            conversation = (chunk.get("kvinject") or {}).get("conversation") or conversation
    total = time.perf_counter() - t0
    first = first if first is not None else total
    tokens = int(usage.get("completion_tokens") or 0)
    return {"ttft": first, "total": total, "text": "".join(text), "tokens": tokens,
            "rate": decode_rate(tokens, first, total),
            "prompt": int(usage.get("prompt_tokens") or 0),
            "cached": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            "conversation": conversation, "usage": usage}


def decode_rate(tokens: int, first: float, total: float) -> float:
    """Tokens per second after the first one: ``(tokens - 1) / (total - first)``; 0 when
    the reply had one token or none."""
    return (tokens - 1) / (total - first) if tokens > 1 and total > first else 0.0


def first_difference(a: list, b: list) -> int | None:
    """The first position where the sequences differ (one ending early counts at its
    length); ``None`` where they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank, 0 < p <= 100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ranked = sorted(values)
    return ranked[max(0, min(len(ranked), math.ceil(p / 100 * len(ranked))) - 1)]


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0
