"""Memories (issue 22): actions, audit, limits, the preference as the first memory (both
ways, whatever the write path), the data migration, and exact durable invalidation.
Real Postgres (triggers included)."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.db import transaction

from tenants import actions
from tenants.errors import Conflict, Forbidden, InvalidInput, NotFound
from tenants.models import AuditEvent, AuditLog, KVInvalidation, Memory, Preference

pytestmark = pytest.mark.django_db


def texts(member) -> list[str]:
    return list(actions.member_memories(member).values_list("text", flat=True))


def outbox_members(since: int) -> list[int | None]:
    return list(KVInvalidation.objects.filter(pk__gt=since).order_by("pk").values_list(
        "member_ref", flat=True))


def last_outbox() -> int:
    return KVInvalidation.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def test_a_members_preference_is_their_first_memory(acme):
    assert texts(acme.user) == ["acme-secret vegetarian, no spicy food"]
    assert texts(acme.admin) == []  # no preference: no memory
    memory = actions.member_memories(acme.user).get()
    assert (memory.source, memory.enabled, memory.pinned) == ("member", True, False)


def test_create_appends_audits_and_keeps_the_preference(acme):
    m = actions.do_create_memory(acme.user, text="I live in Lyon.", actor=acme.user.user)
    assert texts(acme.user) == ["acme-secret vegetarian, no spicy food", "I live in Lyon."]
    row = AuditLog.objects.filter(event_type=AuditEvent.MEMORY_CREATED).get()
    assert row.tenant_id == acme.tenant.pk and row.data["memory"] == m.pk
    assert row.data["new"]["text"] == "I live in Lyon." and row.data["source"] == "member"
    pref = Preference.objects.get(member=acme.user)
    assert (pref.text, pref.version) == ("acme-secret vegetarian, no spicy food", 1)


def test_update_audits_old_and_new_text(acme):
    m = actions.do_create_memory(acme.user, text="I live in Lyon.")
    actions.do_update_memory(acme.user, m.pk, text="I live in Paris.", pinned=True)
    row = AuditLog.objects.filter(event_type=AuditEvent.MEMORY_CHANGED).get()
    assert row.data["old"]["text"] == "I live in Lyon." and not row.data["old"]["pinned"]
    assert row.data["new"]["text"] == "I live in Paris." and row.data["new"]["pinned"]
    actions.do_update_memory(acme.user, m.pk, text="I live in Paris.")  # no change: no row
    assert AuditLog.objects.filter(event_type=AuditEvent.MEMORY_CHANGED).count() == 1
    actions.do_delete_memory(acme.user, m.pk)
    row = AuditLog.objects.filter(event_type=AuditEvent.MEMORY_DELETED).get()
    assert row.data["old"]["text"] == "I live in Paris." and row.data["memory"] == m.pk
    assert not Memory.objects.filter(pk=m.pk).exists()


def test_editing_the_first_memory_writes_the_preference(acme):
    first = actions.member_memories(acme.user).get()
    actions.do_update_memory(acme.user, first.pk, text="pescatarian", enabled=False)
    pref = Preference.objects.get(member=acme.user)
    assert (pref.text, pref.enabled, pref.version) == ("pescatarian", False, 2)
    second = actions.do_create_memory(acme.user, text="I live in Lyon.")
    actions.do_delete_memory(acme.user, first.pk)  # the next one becomes the preference
    assert Preference.objects.get(member=acme.user).text == "I live in Lyon."
    actions.do_delete_memory(acme.user, second.pk)
    assert Preference.objects.get(member=acme.user).text == ""
    assert texts(acme.user) == []


def test_first_memory_of_a_member_without_preference_creates_it(acme):
    actions.do_create_memory(acme.admin, text="Call me Sam.")
    pref = Preference.objects.get(member=acme.admin)
    assert (pref.text, pref.enabled, pref.alpha) == ("Call me Sam.", True, 1.0)
    assert texts(acme.admin) == ["Call me Sam."]  # the trigger added no second memory


@pytest.mark.parametrize("path", ["action", "save", "queryset_update"])
def test_every_preference_write_path_reaches_the_first_memory(acme, path):
    other = actions.do_create_memory(acme.user, text="I live in Lyon.")
    pref = Preference.objects.get(member=acme.user)
    if path == "action":
        actions.do_set_preference(acme.user, text="vegan", enabled=False)
    elif path == "save":
        pref.text, pref.enabled = "vegan", False
        pref.save()
    else:
        Preference.objects.filter(pk=pref.pk).update(text="vegan", enabled=False)
    rows = list(actions.member_memories(acme.user).values_list("text", "enabled"))
    assert rows == [("vegan", False), ("I live in Lyon.", True)]
    assert Memory.objects.get(pk=other.pk).text == "I live in Lyon."


def test_clearing_or_deleting_the_preference_removes_only_the_first_memory(acme):
    actions.do_create_memory(acme.user, text="I live in Lyon.")
    actions.do_set_preference(acme.user, text="")
    assert texts(acme.user) == ["I live in Lyon."]
    actions.do_set_preference(acme.user, text="vegan")  # absent: created in front
    assert texts(acme.user) == ["vegan", "I live in Lyon."]
    actions.do_delete_preference(acme.user)
    assert texts(acme.user) == ["I live in Lyon."]
    assert texts(acme.other) == ["acme other secret"]  # nobody else's


def test_reorder(acme):
    first = actions.member_memories(acme.user).get()
    m = actions.do_create_memory(acme.user, text="I live in Lyon.")
    since = last_outbox()
    with pytest.raises(Conflict):
        actions.do_reorder_memories(acme.user, [m.pk])
    with pytest.raises(Conflict):
        actions.do_reorder_memories(acme.user, [m.pk, m.pk])
    actions.do_reorder_memories(acme.user, [m.pk, first.pk])
    assert texts(acme.user) == ["I live in Lyon.", "acme-secret vegetarian, no spicy food"]
    assert Preference.objects.get(member=acme.user).text == "I live in Lyon."
    assert outbox_members(since) == [acme.user.pk]
    row = AuditLog.objects.filter(event_type=AuditEvent.MEMORY_REORDERED).get()
    assert (row.data["old"], row.data["new"]) == ([first.pk, m.pk], [m.pk, first.pk])


@pytest.mark.parametrize("text", ["", "   \n", "a\x00b", 42, None])
def test_bad_text_is_refused_and_nothing_stored(acme, text):
    before = Memory.objects.count(), AuditLog.objects.count()
    with pytest.raises(InvalidInput) as exc:
        actions.do_create_memory(acme.user, text=text)
    assert "text" in exc.value.details["fields"]
    assert (Memory.objects.count(), AuditLog.objects.count()) == before


def test_limits(acme, settings):
    settings.MEMORY_MAX_CHARS = 10
    settings.MEMORY_MAX_PER_MEMBER = 3
    with pytest.raises(InvalidInput, match="10 characters"):
        actions.do_create_memory(acme.user, text="x" * 11)
    actions.do_create_memory(acme.user, text="x" * 10)
    actions.do_create_memory(acme.user, text="y")
    with pytest.raises(InvalidInput, match="at most 3 memories"):
        actions.do_create_memory(acme.user, text="z")
    assert len(texts(acme.user)) == 3


def test_other_members_and_tenants_memories_are_not_found(acme, globex):
    mine = actions.member_memories(acme.user).get()
    for member in (acme.other, globex.user):
        with pytest.raises(NotFound):
            actions.do_update_memory(member, mine.pk, text="hijack")
        with pytest.raises(NotFound):
            actions.do_delete_memory(member, mine.pk)
    with pytest.raises(Forbidden):  # an admin of another tenant, as an actor
        actions.do_create_memory(acme.user, text="x", actor=globex.admin.user)
    assert Memory.objects.get(pk=mine.pk).text == "acme-secret vegetarian, no spicy food"


def test_each_change_invalidates_exactly_the_members_segment(acme):
    since = last_outbox()
    m = actions.do_create_memory(acme.user, text="I live in Lyon.")
    assert outbox_members(since) == [acme.user.pk]
    since = last_outbox()
    actions.do_update_memory(acme.user, m.pk, enabled=False)
    assert outbox_members(since) == [acme.user.pk]
    since = last_outbox()
    actions.do_delete_memory(acme.user, m.pk)
    assert outbox_members(since) == [acme.user.pk]
    since = last_outbox()
    first = actions.member_memories(acme.user).get()
    actions.do_update_memory(acme.user, first.pk, text="vegan")  # the preference too: once
    assert outbox_members(since) == [acme.user.pk]


def test_a_rolled_back_change_leaves_nothing(acme):
    since, audits = last_outbox(), AuditLog.objects.count()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        actions.do_create_memory(acme.user, text="I live in Lyon.")
        raise Boom
    assert outbox_members(since) == [] and AuditLog.objects.count() == audits
    assert texts(acme.user) == ["acme-secret vegetarian, no spicy food"]


def test_data_migration_turns_each_preference_into_one_memory(acme):
    migration = importlib.import_module("tenants.migrations.0017_memories")
    Memory.objects.filter(tenant=acme.tenant).delete()  # as before 0017
    Preference.objects.filter(member=acme.admin).update(text="")
    migration.preferences_to_memories(apps, None)
    assert texts(acme.user) == ["acme-secret vegetarian, no spicy food"]
    assert texts(acme.other) == ["acme other secret"]
    assert texts(acme.admin) == []
    migration.preferences_to_memories(apps, None)  # members who have memories are skipped
    assert Memory.objects.filter(tenant=acme.tenant).count() == 2
