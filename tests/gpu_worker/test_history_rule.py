"""One history rule (issue 34): the web's budget estimate, the worker's pre-cut and the
engine keep the same messages of the same stored conversation.

Each counts its own way: the engine the rendered prompt (demo model, real template), the
web each message's stored ``token_count`` plus ``TEMPLATE_TOKENS_PER_MESSAGE`` of markup,
the worker's pre-cut (twice the budget) the stored tokens alone. Here every message is
stored with what the engine counts for it less that markup, so the web's count and the
engine's agree and any difference in what is kept is a difference of rule: the web
keeps what the engine keeps of what the worker sends, and where the pre-cut drops
nothing, what the engine keeps of the whole conversation. Conversations short and long
(up to 150 turns), opened by a system message or by an orphan assistant reply, with a
system message mid-way, a turn bigger than the budget, and budgets at the edge (the
history's exact size, one token less, half of it).
"""

from __future__ import annotations

import random

import pytest

from gpu_worker.serving.chat_service import build_request, recent_history
from injection.engine.executor import InjectionExecutor
from injection.metrics import Metrics
from injection.model.loading import load_adapter
from tenants import actions
from tenants.budgets.estimate import history_texts
from tenants.history import TEMPLATE_TOKENS_PER_MESSAGE
from tenants.models import Conversation, Message, Preference

pytestmark = pytest.mark.django_db

WORDS = "rice tea soup bread lentils garden river morning quiet letter window".split()
NEW = {"role": "user", "content": "And what about tomorrow evening?"}


@pytest.fixture(scope="module")
def engine(demo_model_path) -> InjectionExecutor:
    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32")
    return InjectionExecutor(adapter, l1=None, l2=None, metrics=Metrics())


@pytest.fixture
def alice():
    return actions.do_add_member(actions.do_create_tenant("acme"), "alice")


def conversation(seed: int, turns: int, *, opening: str | None = None, mid_system: int = -1,
                 huge_last: bool = False) -> list[dict[str, str]]:
    rnd = random.Random(seed)

    def say(role: str, low: int = 6, high: int = 60) -> dict[str, str]:
        return {"role": role, "content": " ".join(rnd.choices(WORDS, k=rnd.randint(low, high)))}

    out = [say(opening, 6, 12)] if opening else []
    for i in range(turns):
        big = huge_last and i == turns - 1
        out += [say("user", 300, 320) if big else say("user"), say("assistant")]
        if i == mid_system:
            out.append(say("system", 6, 12))
    return out


def store(member, engine: InjectionExecutor, history: list[dict[str, str]]) -> Conversation:
    """The conversation stored with each message's token_count = the engine's count of
    it, less the markup the web and the worker add."""
    def count(msgs: list[dict[str, str]]) -> int:
        return engine.adapter.prompt_tokens("", msgs)

    conv = Conversation.objects.create(tenant=member.tenant, member=member, title="t")
    base = count([NEW])
    rows = []
    for m in history:
        tokens = count([m, NEW]) - base - TEMPLATE_TOKENS_PER_MESSAGE
        assert tokens >= 0
        rows.append(Message(tenant=member.tenant, conversation=conv, role=m["role"],
                            content=m["content"], token_count=tokens))
    Message.objects.bulk_create(rows)
    return conv


def turn_tokens(conv: Conversation) -> int:
    """The stored size of the history's whole turns (from its first user message)."""
    rows = list(conv.messages.order_by("created_at", "id"))
    first = next(i for i, m in enumerate(rows) if m.role == "user")
    return sum(m.token_count + TEMPLATE_TOKENS_PER_MESSAGE for m in rows[first:])


def engine_keeps(engine: InjectionExecutor, member, history: list[dict[str, str]]) -> int:
    """History messages (system ones aside) the engine keeps before the new message."""
    pref = Preference.objects.filter(member=member).first()
    req = build_request(member, pref, [*history, NEW], {"max_new_tokens": 1})
    return engine.execute(req).history_messages


CASES = [  # (seed, turns, shape, budgets: ints, or "edge" for total, total - 1, total // 2)
    (1, 1, {}, "edge"),
    (2, 3, {}, [0, 10, "edge"]),
    (3, 12, {}, "edge"),
    (4, 12, {"opening": "system"}, [200, "edge"]),
    (5, 12, {"opening": "assistant"}, [200, "edge"]),
    (6, 12, {"mid_system": 5}, [150, "edge"]),
    (7, 8, {"huge_last": True}, [300, 1200]),
    (8, 150, {}, [64, 300, 1024]),
    (9, 60, {"opening": "system", "mid_system": 40}, [97, 512]),
]


def budgets_of(spec, total: int) -> list[int]:
    edge = [total, total - 1, total // 2]
    if spec == "edge":
        return edge
    return [b for s in spec for b in (edge if s == "edge" else [s])]


@pytest.mark.parametrize(("seed", "turns", "shape", "spec"), CASES)
def test_the_web_the_worker_and_the_engine_keep_the_same_messages(
        alice, engine, settings, seed, turns, shape, spec):
    history = conversation(seed, turns, **shape)
    conv = store(alice, engine, history)
    total = turn_tokens(conv)
    cuts = 0
    for budget in budgets_of(spec, total):
        settings.CHAT_HISTORY_TOKEN_BUDGET = budget
        sent = recent_history(conv, budget)  # the worker's pre-cut
        web, _ = history_texts(alice, conv.pk, None)
        head = [m for m in history[:1] if m["role"] == "system"]
        kept = head + sent[len(sent) - (len(web) - len(head)):] if len(web) > len(head) else head
        assert web == [m["content"] for m in kept]  # the engine's keep of what was sent
        for part in (sent, kept):
            tail = part[len(head):]
            assert part[:len(head)] == head  # the leading system message is always kept
            assert tail == history[len(history) - len(tail):]  # the newest messages ...
            assert not tail or tail[0]["role"] == "user"  # ... in whole turns
        n = sum(m["role"] != "system" for m in kept)
        assert engine_keeps(engine, alice, sent) == n, budget
        if len(sent) == len(history) - (history[0]["role"] == "assistant"):  # nothing cut
            assert engine_keeps(engine, alice, history) == n, budget  # the whole of it
        cuts += len(kept) < len(sent)
    assert cuts > 0  # some budget here cuts the history
