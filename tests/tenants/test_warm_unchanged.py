"""A save that changes nothing a member's segment is rendered from invalidates and warms
nothing (``tenants.signals``): their segment and lean would be computed again as they are.
Real Postgres and the real Redis broker, as in ``test_warm_on_edit``."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.models import KVInvalidation, Preference
from tests.tenants.test_warm_on_edit import drop, pair, queue, sent  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def _outbox(member) -> int:
    return KVInvalidation.objects.filter(member_ref=member.pk).count()


def test_a_save_of_the_same_text_or_another_alpha_warms_nothing(queue, pair):  # noqa: F811
    alice, _ = pair
    before = _outbox(alice)
    pref = Preference.objects.get(member=alice)
    pref.save()  # e.g. an admin form saved as it was
    actions.do_set_preference(alice, alpha=0.5)  # alpha scales at injection: same segment
    memory = actions.member_memories(alice).get()
    memory.save()
    assert sent(queue) == [] and _outbox(alice) == before
    actions.do_set_preference(alice, text="I am vegan.")  # a change still warms, once
    assert [m["args"] for m in sent(queue)] == [[alice.pk]] and _outbox(alice) > before


def test_a_changed_pin_or_order_still_invalidates_and_warms(queue, pair):  # noqa: F811
    alice, _ = pair
    first = actions.member_memories(alice).get()
    before = _outbox(alice)
    actions.do_update_memory(alice, first.pk, pinned=not first.pinned)
    assert [m["args"] for m in sent(queue)] == [[alice.pk]] and _outbox(alice) > before
    drop(queue)
    reloaded = actions.member_memories(alice).get()
    reloaded.position += 1
    reloaded.save()
    assert [m["args"] for m in sent(queue)] == [[alice.pk]]


def test_a_deferred_field_never_reads_as_unchanged(queue, pair):  # noqa: F811
    alice, _ = pair
    # nothing known of its text (never read for this): invalidated and warmed as before
    Preference.objects.only("pk", "tenant", "member", "alpha").get(member=alice).save(
        update_fields=["alpha"])
    assert [m["args"] for m in sent(queue)] == [[alice.pk]]
