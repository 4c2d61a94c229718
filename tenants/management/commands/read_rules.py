"""``manage.py read_rules``: read again the rules stored with memories and tenant instructions
by an older reader (issue 57; ``tenants.rules``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Read again the rules of memories and tenant instructions stored by an older "
            "reader (run after an upgrade that changes READER_VERSION; until then the "
            "workers read such texts on every chat).")

    def handle(self, *args, **opts):
        from injection.prompting.rules import READER_VERSION
        from tenants.rules import read_stale

        memories, tenants = read_stale()
        self.stdout.write(f"read again by reader {READER_VERSION}: {memories} memories, "
                          f"{tenants} tenants' instructions")
