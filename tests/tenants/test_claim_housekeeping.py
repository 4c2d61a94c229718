"""Idempotency loose ends (issue 20): replays cost no rate limit; dead claims are pruned."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now

from tenants import actions
from tenants.models import ChatExchange
from tests.tenants.test_chat_exchanges import api_chat, claim, store, view_claim

pytestmark = pytest.mark.django_db
State = ChatExchange.State


def test_replays_of_an_idempotency_key_cost_nothing_against_the_rate_limit(acme, settings):
    settings.CHAT_RATE_PER_MEMBER = "2/min"
    settings.CHAT_RATE_PER_TENANT = "100/min"
    first = view_claim(acme.user, "order-7")
    store(acme.user, first.request_id, reply="Lentil soup.")
    replays = [api_chat(acme.user_key, "order-7") for _ in range(4)]
    assert [r.status_code for r in replays] == [200] * 4
    assert all(r["Idempotent-Replayed"] == "true" for r in replays)
    # a reused key asking for something else is refused (422) and free as well
    assert api_chat(acme.user_key, "order-7", "Something else").status_code == 422
    # the member's whole budget is still there: two fresh requests (400: empty), then 429
    fresh = [api_chat(acme.user_key, None, message="").status_code for _ in range(3)]
    assert fresh == [400, 400, 429]


def test_a_key_not_yet_answered_is_counted(acme, settings):
    settings.CHAT_RATE_PER_MEMBER = "1/min"
    view_claim(acme.user, "order-8")  # pending: its retry is a 409, not a replay
    assert api_chat(acme.user_key, "order-8").status_code == 409
    assert api_chat(acme.user_key, "order-8").status_code == 429


def age(exchange_id: int, seconds: float) -> None:
    """Make a row look untouched for ``seconds`` (the database clock decides)."""
    past = Now() - timedelta(seconds=seconds)
    ChatExchange.objects.filter(pk=exchange_id).update(updated_at=past, deadline=past)


def row(member, key: str, state: str, old: bool) -> int:
    c = claim(member, key=key, request_id=uuid.uuid4().hex)
    if state == State.DONE:
        store(member, c.request_id)
    elif state == State.ABANDONED:
        actions.do_abandon_chat(member, c.request_id, reason="test")
    pk = ChatExchange.objects.get(member=member, key=key).pk
    if old:
        age(pk, 7200)
    return pk


def test_only_dead_claims_past_the_retention_are_pruned(acme, globex):
    keep = [row(acme.user, "done-old", State.DONE, old=True),
            row(acme.user, "abandoned-new", State.ABANDONED, old=False),
            row(acme.user, "pending-live", State.PENDING, old=False)]
    gone = [row(acme.user, "abandoned-old", State.ABANDONED, old=True),
            row(globex.user, "pending-dead", State.PENDING, old=True)]
    assert actions.do_prune_claims(3600, batch=1) == 2  # in batches
    left = set(ChatExchange.objects.values_list("pk", flat=True))
    assert set(keep) <= left and not set(gone) & left
    assert actions.do_prune_claims(3600) == 0
    # a retry with a pruned key claims it afresh and may run
    again = claim(acme.user, key="abandoned-old")
    assert again.replay is None and actions.claim_is_live(acme.user.pk, again.request_id)


@pytest.mark.django_db(transaction=True)  # housekeeping closes old connections
def test_the_worker_agent_prunes_during_housekeeping(acme, settings):
    from gpu_worker.routing.agent import WorkerAgent

    settings.CHAT_CLAIM_RETENTION = 3600
    settings.CHAT_CLAIM_PRUNE_INTERVAL = 600
    dead = row(acme.user, "abandoned-old", State.ABANDONED, old=True)
    agent = WorkerAgent(f"agent-{uuid.uuid4().hex[:8]}", "solo")
    agent.housekeep()
    assert not ChatExchange.objects.filter(pk=dead).exists()
    later = row(acme.user, "abandoned-later", State.ABANDONED, old=True)
    agent.housekeep()  # within the prune interval: left for the next pass
    assert ChatExchange.objects.filter(pk=later).exists()
    assert agent.prune_claims() == 1
