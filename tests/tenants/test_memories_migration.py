"""Migration 0017 on real Postgres: migrated back to 0016, a member with a preference (and
one without, one with an empty preference) migrated forward get exactly their preference
as their one first memory, and the preference trigger is in place afterwards."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("tenants", "0016_tenant_max_completion_tokens")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def test_preferences_become_first_memories():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("tenants")
    old = migrate(BEFORE)
    Tenant, Member = old.get_model("tenants", "Tenant"), old.get_model("tenants", "Member")
    Preference, User = old.get_model("tenants", "Preference"), old.get_model("auth", "User")
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    members = {}
    for name, text in (("alice", "I am vegetarian."), ("bob", ""), ("carol", None)):
        member = Member.objects.create(tenant=tenant, user=User.objects.create(username=name))
        members[name] = member.pk
        if text is not None:
            Preference.objects.create(tenant=tenant, member=member, text=text,
                                      enabled=name == "alice")
    new = migrate(latest)
    Memory = new.get_model("tenants", "Memory")
    rows = list(Memory.objects.order_by("member_id").values_list(
        "member_id", "text", "enabled", "position", "source"))
    assert rows == [(members["alice"], "I am vegetarian.", True, 0, "member")]
    # the trigger is installed: a preference write reaches the first memory
    new.get_model("tenants", "Preference").objects.filter(member_id=members["alice"]).update(
        text="I am vegan.")
    assert Memory.objects.get(member_id=members["alice"]).text == "I am vegan."


def test_migration_0025_reads_the_rules_of_existing_rows():
    """Rows written before the rules existed are read by the migration (issue 57)."""
    from injection.prompting import rules as reader

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("tenants")
    old = migrate([("tenants", "0024_tenant_decoding_constraints")])
    Tenant, Member = old.get_model("tenants", "Tenant"), old.get_model("tenants", "Member")
    Preference, User = old.get_model("tenants", "Preference"), old.get_model("auth", "User")
    tenant = Tenant.objects.create(slug="acme", name="Acme", instructions="Reply in French.")
    member = Member.objects.create(tenant=tenant, user=User.objects.create(username="alice"))
    Preference.objects.create(tenant=tenant, member=member, text="Always answer in lowercase.")
    new = migrate(latest)
    memory = new.get_model("tenants", "Memory").objects.get(member_id=member.pk)
    assert (memory.rules, memory.rules_version, memory.rules_enabled) == (
        reader.to_json(reader.read("Always answer in lowercase.")), reader.READER_VERSION, True)
    tenant = new.get_model("tenants", "Tenant").objects.get(pk=tenant.pk)
    assert tenant.instruction_rules == reader.to_json(reader.read_instructions(
        "Reply in French.")) and tenant.instruction_rules_version == reader.READER_VERSION
