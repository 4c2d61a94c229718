"""A memory's rules as data (issue 57), on real Postgres: read once by the action that saves
the text (a memory, the preference through its trigger, the tenant's instructions), emptied
by the database whenever the text changes otherwise, switched off and on through an audited
action that writes no invalidation; the worker's request carries them (stored, read again
where stale, ``NONE`` where switched off)."""

from __future__ import annotations

import uuid

import pytest

from gpu_worker.serving.chat_service import build_request, instruction_rules, load_memories
from injection.prompting import rules as reader
from tenants import actions
from tenants.errors import Forbidden, InvalidInput, NotFound
from tenants.models import AuditEvent, AuditLog, KVInvalidation, Memory, Preference, Tenant
from tests.tenants.test_warm_on_edit import drop, sent

pytestmark = pytest.mark.django_db

LOWER = "Always answer in lowercase."


@pytest.fixture
def alice():
    tenant = actions.do_create_tenant("acme")
    return actions.do_add_member(tenant, "alice", preference=LOWER)


def stored(memory_pk: int) -> tuple:
    row = Memory.objects.get(pk=memory_pk)
    return row.rules, row.rules_version, row.rules_enabled


def test_rules_are_read_when_a_memory_is_saved(alice):
    first = actions.member_memories(alice).get()  # written by the preference trigger
    assert stored(first.pk) == (reader.to_json(reader.read(LOWER)), reader.READER_VERSION, True)
    assert reader.from_json(stored(first.pk)[0]).constraints == ("lowercase",)
    lyon = actions.do_create_memory(alice, text="I live in Lyon.")
    assert stored(lyon.pk)[:2] == (reader.to_json(reader.NONE), reader.READER_VERSION)
    actions.do_update_memory(alice, lyon.pk, text="Never use commas in your replies.")
    assert reader.from_json(stored(lyon.pk)[0]).constraints == ("no_comma",)
    actions.do_set_preference(alice, text="I live in Paris.")  # the trigger's update
    assert stored(first.pk)[:2] == (reader.to_json(reader.NONE), reader.READER_VERSION)


def test_the_database_empties_rules_when_a_text_changes_by_any_other_path(alice):
    first = actions.member_memories(alice).get()
    Memory.objects.filter(pk=first.pk).update(text="I live in Lyon.")
    assert stored(first.pk)[:2] == (None, 0)  # not the old text's lowercase
    Memory.objects.filter(pk=first.pk).update(pinned=True)  # not the text: kept as it is
    assert stored(first.pk)[:2] == (None, 0)
    Preference.objects.filter(member=alice).update(text="Reply in French.")  # via trigger
    assert stored(first.pk)[:2] == (None, 0)
    # the worker reads the text where nothing is stored, the API shows the same
    assert load_memories(alice)[0].rules == reader.read("Reply in French.")
    assert actions.preference_rules(alice)["language"] == "French"


def test_the_worker_reads_stale_rules_again_and_leaves_the_row(alice):
    first = actions.member_memories(alice).get()
    Memory.objects.filter(pk=first.pk).update(rules={"constraints": ["uppercase"]},
                                              rules_version=reader.READER_VERSION - 1)
    assert load_memories(alice)[0].rules == reader.read(LOWER)
    Memory.objects.filter(pk=first.pk).update(rules={"constraints": 3},
                                              rules_version=reader.READER_VERSION)
    assert load_memories(alice)[0].rules == reader.read(LOWER)  # malformed: read again
    assert stored(first.pk)[0] == {"constraints": 3}  # the chat path writes nothing


def test_switching_rules_off_is_audited_and_invalidates_nothing(alice):
    first = actions.member_memories(alice).get()
    before = KVInvalidation.objects.count()
    memory = actions.do_set_memory_rules_enabled(alice, first.pk, False, actor=alice.user)
    assert memory.rules_enabled is False and Memory.objects.get(pk=first.pk).enabled
    assert load_memories(alice)[0].rules == reader.NONE  # the memory stays, no rule
    row = AuditLog.objects.get(event_type=AuditEvent.MEMORY_RULES_SWITCHED)
    assert row.tenant_id == alice.tenant_id and row.actor_id == alice.user_id
    assert row.data["memory"] == first.pk and row.data["new"] == {"rules_enabled": False}
    assert row.data["rules"]["constraints"] == ["lowercase"]
    # unchanged: no second row; back on: the rules again
    actions.do_set_memory_rules_enabled(alice, first.pk, False)
    assert AuditLog.objects.filter(event_type=AuditEvent.MEMORY_RULES_SWITCHED).count() == 1
    actions.do_set_memory_rules_enabled(alice, first.pk, True)
    assert load_memories(alice)[0].rules.constraints == ("lowercase",)
    assert KVInvalidation.objects.count() == before  # nothing cached depends on rules
    # an edit keeps the switch: the member said no to this memory's rules
    actions.do_set_memory_rules_enabled(alice, first.pk, False)
    actions.do_update_memory(alice, first.pk, text="Always answer in capital letters.")
    assert stored(first.pk)[2] is False and load_memories(alice)[0].rules == reader.NONE


def test_another_members_memory_or_a_bad_value_is_refused(alice):
    bob = actions.do_add_member(Tenant.objects.get(pk=alice.tenant_id), "bob",
                                preference="Never use commas.")
    other = actions.do_add_member(actions.do_create_tenant("globex"), "olga",
                                  preference="Reply in German.")
    for member in (bob, other):
        pk = actions.member_memories(member).get().pk
        with pytest.raises(NotFound):
            actions.do_set_memory_rules_enabled(alice, pk, False)
        assert stored(pk)[2] is True
    with pytest.raises(Forbidden):  # an admin actor of another tenant
        actions.do_set_memory_rules_enabled(
            alice, actions.member_memories(alice).get().pk, False, actor=other.user)
    with pytest.raises(InvalidInput):
        actions.do_set_memory_rules_enabled(alice, actions.member_memories(alice).get().pk, 0)


def test_the_preference_switch_is_its_first_memorys(alice):
    actions.do_change_preference(alice, rules_enabled=False)
    assert actions.preference_rules(alice) == {
        "constraints": ["lowercase"], "language": None, "standing": True, "enabled": False}
    actions.do_set_preference(alice, text="")  # no text: no memory, nothing to switch
    with pytest.raises(InvalidInput):
        actions.do_change_preference(alice, rules_enabled=True)


def test_instruction_rules_are_read_when_saved_and_switchable():
    tenant = actions.do_create_tenant("acme")
    assert (tenant.instruction_rules, tenant.instruction_rules_version) == (
        reader.to_json(reader.NONE), reader.READER_VERSION)
    tenant = actions.do_set_tenant_instructions(tenant, "Never use the word 'basically'.")
    expected = reader.read_instructions("Never use the word 'basically'.")
    assert reader.from_json(tenant.instruction_rules) == expected
    assert instruction_rules(tenant) == expected
    alice = actions.do_add_member(tenant, "alice", preference="I live in Lyon.")
    req = build_request(alice, None, [{"role": "user", "content": "hi"}], {})
    assert req.instruction_rules == expected
    Tenant.objects.filter(pk=tenant.pk).update(instructions="Reply in French.")
    tenant.refresh_from_db()
    assert tenant.instruction_rules is None  # emptied by the database: read again
    assert instruction_rules(tenant) == reader.read_instructions("Reply in French.")
    tenant = actions.do_update_tenant(tenant, instruction_rules_enabled=False)
    assert instruction_rules(tenant) == reader.NONE
    assert AuditLog.objects.filter(event_type=AuditEvent.TENANT_CHANGED,
                                   data__new={"instruction_rules_enabled": False}).exists()


@pytest.fixture
def warm_queue(settings):
    """A warm queue of this test's own (as ``test_warm_on_edit``'s): no worker reads it."""
    name = f"kvi-test-warm-{uuid.uuid4().hex[:8]}"
    settings.KV_WARM_ON_EDIT, settings.KV_WARM_QUEUE = True, name
    yield name
    drop(name)


@pytest.mark.django_db(transaction=True)
def test_switching_rules_on_warms_the_member_and_off_does_not(warm_queue):
    """Back on, a memory asking for guidance needs the member's lean: a worker measures it
    ahead (the warm after an edit); off, nothing is to be computed, nothing is sent."""
    alice = actions.do_add_member(actions.do_create_tenant("acme"), "alice",
                                  preference="Reply in French.")
    first = actions.member_memories(alice).get()
    drop(warm_queue)
    actions.do_set_memory_rules_enabled(alice, first.pk, False)
    assert sent(warm_queue) == []
    actions.do_set_memory_rules_enabled(alice, first.pk, True)
    (msg,) = sent(warm_queue)
    assert msg["args"] == [alice.pk] and msg["kwargs"] == {"background": True}


def test_read_rules_reads_what_an_older_reader_stored(alice):
    from io import StringIO

    from django.core.management import call_command

    first = actions.member_memories(alice).get()
    Memory.objects.filter(pk=first.pk).update(rules={"constraints": ["uppercase"]},
                                              rules_version=reader.READER_VERSION - 1)
    Tenant.objects.filter(pk=alice.tenant_id).update(instruction_rules_version=0)
    out = StringIO()
    call_command("read_rules", stdout=out)
    assert "1 memories, 1 tenants" in out.getvalue()
    assert stored(first.pk)[:2] == (reader.to_json(reader.read(LOWER)), reader.READER_VERSION)
    call_command("read_rules", stdout=out)
    assert "0 memories, 0 tenants" in out.getvalue()
