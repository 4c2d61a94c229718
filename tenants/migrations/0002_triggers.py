"""Database-enforced invariants, so no write path (admin, API, QuerySet.update(), shell) escapes them.

- preference version: bumped on every change of text/enabled/alpha; updated_at refreshed.
- audit log: append-only; UPDATE and DELETE are refused.
"""

from django.db import migrations

PREFERENCE_VERSION = """
CREATE OR REPLACE FUNCTION tenants_preference_bump_version() RETURNS trigger AS $$
BEGIN
    IF NEW.text IS DISTINCT FROM OLD.text
       OR NEW.enabled IS DISTINCT FROM OLD.enabled
       OR NEW.alpha IS DISTINCT FROM OLD.alpha THEN
        NEW.version := OLD.version + 1;
        NEW.updated_at := now();
    ELSE
        NEW.version := OLD.version;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER tenants_preference_version
BEFORE UPDATE ON tenants_preference
FOR EACH ROW EXECUTE FUNCTION tenants_preference_bump_version();
"""

AUDIT_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION tenants_auditlog_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER tenants_auditlog_append_only
BEFORE UPDATE OR DELETE ON tenants_auditlog
FOR EACH ROW EXECUTE FUNCTION tenants_auditlog_append_only();
"""

REVERSE = """
DROP TRIGGER IF EXISTS tenants_preference_version ON tenants_preference;
DROP FUNCTION IF EXISTS tenants_preference_bump_version();
DROP TRIGGER IF EXISTS tenants_auditlog_append_only ON tenants_auditlog;
DROP FUNCTION IF EXISTS tenants_auditlog_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [
        migrations.RunSQL(PREFERENCE_VERSION + AUDIT_APPEND_ONLY, REVERSE),
    ]
