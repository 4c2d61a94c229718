"""Migration 0023 on real Postgres: a database that has ``tenants_tenant.memory_emphasis``
(migrated back to 0022, a tenant with the field set) migrated forward loses the column and
keeps the tenant and its other memory settings; migrated back, the column returns empty."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.tenants.test_memories_migration import migrate

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("tenants", "0022_usage_guide_tokens")]
AFTER = [("tenants", "0023_remove_tenant_memory_emphasis")]


def columns(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


def test_the_column_is_dropped_and_the_tenant_kept():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("tenants")
    try:
        old = migrate(BEFORE)
        Tenant = old.get_model("tenants", "Tenant")
        table = Tenant._meta.db_table
        Tenant.objects.create(slug="acme", name="Acme", memory_emphasis=2.0,
                              memory_contrast=0.5)
        assert "memory_emphasis" in columns(table)
        new = migrate(AFTER)
        assert "memory_emphasis" not in columns(table)
        tenant = new.get_model("tenants", "Tenant").objects.get(slug="acme")
        assert (tenant.name, tenant.memory_contrast) == ("Acme", 0.5)
        back = migrate(BEFORE)  # reversible: the column returns, empty
        tenant = back.get_model("tenants", "Tenant").objects.get(slug="acme")
        assert tenant.memory_emphasis is None
    finally:
        migrate(latest)  # the tests after this one run on the latest schema
