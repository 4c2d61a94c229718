"""The worker side of one chat turn: member -> prompt -> injected generation -> stored reply."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any, NamedTuple, NoReturn

from django.conf import settings

from gpu_worker.channels import kvstore, streams
from gpu_worker.serving.attempts import Attempt
from gpu_worker.serving.host import get_executor
from injection.base import DEFAULT_ALPHA, ExecutionRequest, MemoryItem
from tenants import rules
from tenants.actions import (
    do_admit_prompt,
    do_record_cancelled,
    do_record_chat,
    do_record_discarded,
    get_conversation,
)
from tenants.budgets import ledger
from tenants.errors import ChatAbandoned, InactiveAccount, NotFound
from tenants.history import stored_history
from tenants.models import Conversation, Member, Memory, Preference, Tenant

log = logging.getLogger(__name__)


def load_member(member_id: int) -> Member:
    """The member with its tenant, user and preference (one query), active or refused."""
    member = Member.objects.select_related("tenant", "user", "preference").filter(
        pk=member_id).first()
    if member is None:
        raise NotFound("Unknown member.")
    if not (member.active and member.tenant.active and member.user.is_active):
        raise InactiveAccount()
    return member


def load_conversation(member: Member, conversation_id: int | None) -> Conversation | None:
    return None if conversation_id is None else get_conversation(member, conversation_id)


def recent_history(conv: Conversation | None, budget: int | None) -> list[dict]:
    """The stored conversation as the engine gets it, oldest first: the engine's rule at
    twice ``budget`` over stored token counts (``tenants.history.precut``). The engine
    then keeps, by the same rule, the whole turns that fit the budget and the model's
    context, counting exactly; the web's budget estimate counted what it keeps."""
    if conv is None:
        return []
    return stored_history(conv.tenant_id, conv.member_id, conv.pk, budget)


def load_memories(member: Member) -> tuple[MemoryItem, ...]:
    """The member's enabled memories, in order (the first is their preference), each with
    the rules stored with it (``tenants.rules``: read again where stored by an older reader;
    none where switched off)."""
    rows = Memory.objects.filter(tenant=member.tenant_id, member=member, enabled=True).order_by(
        "position", "id").values_list("pk", "text", "pinned", "rules", "rules_version",
                                      "rules_enabled")
    return tuple(MemoryItem(id=str(pk), text=text, pinned=pinned,
                            rules=rules.applied(stored, version, text, enabled))
                 for pk, text, pinned, stored, version, enabled in rows)


def instruction_rules(tenant: Tenant):
    """The rules stored with the tenant's instructions (as a memory's, ``load_memories``)."""
    return rules.applied(tenant.instruction_rules, tenant.instruction_rules_version,
                         tenant.instructions, tenant.instruction_rules_enabled,
                         instructions=True)


def memories_used(result, memories: tuple[MemoryItem, ...]) -> list[dict]:
    """``result.extra["memories_used"]`` with each memory's text, for this member's own
    memories only (an id the engine names that is not one of them is dropped)."""
    own = {m.id: m.text for m in memories}
    used = result.extra.get("memories_used") or ()
    return [{"id": int(u["id"]) if u["id"].isdigit() else u["id"], "text": own[u["id"]],
             "how": u.get("how", "segment")}
            for u in used if isinstance(u, dict) and u.get("id") in own]


def _chosen(params: dict, tenant: Tenant, key: str, field: str) -> Any:
    """A mechanism's setting: the request's ``key``, else the tenant's ``field``; None: the
    model's default (its profile, model/profiles)."""
    value = params.get(key)
    return getattr(tenant, field, None) if value is None else value


def build_request(member: Member, pref: Preference | None, messages: list[dict], params: dict,
                  stream=None, conversation_id: str | None = None,
                  memories: tuple[MemoryItem, ...] = (), watch=None,
                  request_id: str | None = None):
    """The engine's request. ``stream``: the publisher of a streamed chat (its pieces, and
    its cancel flag); ``watch``: the cancel flag of one that is not streamed;
    ``request_id``: the claim whose reservation the real prompt settles (``admit``)."""
    watch = stream if stream is not None else watch
    max_new = int(params.get("max_new_tokens") or settings.CHAT_DEFAULT_MAX_NEW_TOKENS)
    alpha = params.get("alpha")
    if alpha is None:
        alpha = pref.alpha if pref else DEFAULT_ALPHA
    contrast, reminder, constrain, guard = (_chosen(params, member.tenant, k, f) for k, f in (
        ("contrast", "memory_contrast"), ("reminder", "memory_reminder"),
        ("constraints", "decoding_constraints"), ("loop_guard", "loop_guard")))
    return ExecutionRequest(
        tenant=str(member.tenant_id),
        user=str(member.pk),
        messages=messages,
        preference_text=pref.text if pref else "",
        instructions=member.tenant.instructions,
        instruction_rules=instruction_rules(member.tenant),
        # memories (when any is enabled) render the member part; else the preference as before
        injection_enabled=bool(memories) or bool(pref and pref.enabled),
        memories=memories,
        alpha=float(alpha),
        contrast=None if contrast is None else float(contrast),
        reminder=None if reminder is None else bool(reminder),
        constrain=None if constrain is None else bool(constrain),
        loop_guard=None if guard is None else bool(guard),
        max_new_tokens=max_new,
        temperature=float(params.get("temperature") or 0.0),
        top_p=float(params.get("top_p") or 1.0),
        seed=None if params.get("seed") is None else int(params["seed"]),
        stop=tuple(params.get("stop") or ()),
        history_token_budget=settings.CHAT_HISTORY_TOKEN_BUDGET,
        on_text=stream.piece if stream is not None else None,
        cancelled=watch.cancelled if watch is not None else None,
        admit=None if request_id is None else partial(admit_prompt, member, request_id, max_new),
        conversation_id=conversation_id,
    )


def admit_prompt(member: Member, request_id: str, max_new_tokens: int,
                 prompt_tokens: int) -> int:
    """The engine's ``admit``: the rendered prompt settles the claim's budget reservation;
    the completion tokens it may generate (BudgetExceeded / ChatAbandoned: none)."""
    return do_admit_prompt(member, request_id, prompt_tokens=prompt_tokens,
                           max_new_tokens=max_new_tokens)


def release_reservation(member_id: int, request_id: str) -> None:
    """The attempt was refused or failed: its budget reservation is free (what it
    generated, if anything, is billed already). Never raises over the task's own error:
    with Postgres down the reservation lapses on its own (``tenants.budgets.ledger``)."""
    try:
        ledger.release(member_id, request_id)
    except Exception as exc:
        log.warning("chat request_id=%s: reservation not released: %r", request_id, exc)


def cancelled(member: Member, request_id: str, tokens: int, stream, *,
              prompt_tokens: int = 0, cached_tokens: int = 0, **guide: int) -> NoReturn:
    """The client went away, or the web stopped waiting, mid-generation (the cancel flag):
    nothing is stored; audited, counted, and the tokens it used billed."""
    from gpu_worker.ops import metrics

    metrics.CHAT_CANCELLED.inc()
    billed = do_record_cancelled(member, request_id, completion_tokens=tokens,
                                 prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                                 **guide)
    if stream is not None:
        stream.end("cancelled")
    raise ChatAbandoned(f"cancelled after {tokens} tokens ({_billed(billed)})")


def discarded(member: Member, request_id: str, result, stream) -> NoReturn:
    """The reply was generated, but its claim was abandoned meanwhile (``do_record_chat``
    refused it): nothing is stored; its tokens are billed in their own transaction."""
    billed = do_record_discarded(
        member, request_id, prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens,
        finish_reason=result.finish_reason, **guide_tokens(result))
    if stream is not None:
        stream.end("cancelled")
    raise ChatAbandoned(f"abandoned while generating; {result.completion_tokens} tokens "
                        f"generated, not stored ({_billed(billed)})")


def guide_tokens(result) -> dict[str, int]:
    """The contrastive guide row's tokens of ``result`` (0 where none ran): billed beside
    the reply's, never inside its prompt or completion tokens."""
    return {k: int(getattr(result, k, 0) or 0)
            for k in ("guide_prefill_tokens", "guide_decode_tokens")}


def _billed(billed: bool) -> str:
    return "billed" if billed else "billed already: a duplicate run"


class Turn(NamedTuple):
    """What a generated reply is stored with (``record``)."""

    member: Member
    conversation: Conversation | None
    message: str
    params: dict
    request_id: str
    pref: Preference | None
    memories: tuple[MemoryItem, ...]
    stream: Any  # the streamed chat's publisher, else None
    started: float  # time.monotonic() when the task started


def answer(
    member_id: int, conversation_id: int | None, message: str, params: dict, request_id: str
) -> dict[str, Any]:
    started = time.monotonic()
    member = load_member(member_id)
    conv = load_conversation(member, conversation_id)
    pref = member.own_preference()
    memories = load_memories(member)
    executor = get_executor()
    # /v1 sends the conversation itself ("history"); /api/chat continues the stored one
    history = params.get("history")
    if history is None:
        history = recent_history(conv, settings.CHAT_HISTORY_TOKEN_BUDGET)
    messages = [*history, {"role": "user", "content": message}]
    stream = streams.publisher(request_id) if params.get("stream") else None
    attempt = Attempt(member, request_id)  # a failure bills what it generated
    try:
        # /api/chat continues a stored conversation: its K/V link is keyed by its id
        # (/v1 sends the messages: keyed by their hash chain)
        conv_key = (kvstore.conversation_key(conv.pk)
                    if conv is not None and params.get("history") is None else None)
        result = executor.execute(attempt.watching(build_request(
            member, pref, messages, params, stream, conv_key, memories,
            watch=streams.cancel_watch(request_id),  # the web may stop waiting
            request_id=request_id)))  # the budgets settle on the real prompt
    except Exception as exc:
        if stream is not None:
            stream.end("error")
        attempt.failed(exc)
        raise
    turn = Turn(member, conv, message, params, request_id, pref, memories, stream, started)
    try:
        return record(turn, result, executor.adapter.count_tokens(message))
    except ChatAbandoned:  # cancelled or discarded: billed by record itself
        raise
    except Exception as exc:  # e.g. the time limit while storing: generated, not stored
        attempt.failed(exc, result)
        raise


def record(turn: Turn, result, message_tokens: int) -> dict[str, Any]:
    """Store the generated reply under the turn's claim and return the API body; or, when
    it was cancelled or its claim abandoned meanwhile, bill it and raise ChatAbandoned."""
    member, pref, stream = turn.member, turn.pref, turn.stream
    if result.finish_reason == "cancelled":
        cancelled(member, turn.request_id, result.completion_tokens, stream,
                  prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens,
                  **guide_tokens(result))
    reply = result.text  # control characters already removed by the engine (NUL included)
    usage = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        # prompt tokens whose K/V came from a cache (never more than prompt_tokens)
        "cached_tokens": result.cached_tokens,
        **guide_tokens(result),  # the contrastive guide's row, beside the reply's
        "message_tokens": message_tokens,
    }
    cache = result.cache_info()
    cache["preference_version"] = pref.version if pref else None
    # content_hash: the preference text's (as GET /api/preference reports it);
    # segment_hash: the injected system turn's, i.e. the K/V's identity
    cache["segment_hash"] = cache["content_hash"]
    applied = pref is not None and pref.enabled and bool(pref.text) and result.extra.get(
        "preference_applied", result.injection_mode != "none")
    cache["content_hash"] = pref.content_hash if applied else ""
    cache["instructions_version"] = member.tenant.instructions_version
    cache["finish_reason"] = result.finish_reason
    latency_ms = (time.monotonic() - turn.started) * 1000
    used = memories_used(result, turn.memories)
    try:
        conv = do_record_chat(
            member, turn.conversation, message=turn.message, reply=reply, usage=usage,
            cache=cache, latency_ms=latency_ms, request_id=turn.request_id,
            prior=turn.params.get("history") or (), end_user=turn.params.get("user"),
            memories_used=used,
        )
    except ChatAbandoned:  # rolled back: the reply is not stored, but it was generated
        discarded(member, turn.request_id, result, stream)
    usage.pop("message_tokens")
    if stream is not None:
        stream.end("done")
    return {
        "reply": reply,
        "conversation": conv.pk,
        "usage": usage,
        "cache": cache,
        "request_id": turn.request_id,
        "memories_used": used,
    }
