"""Demo seed: tenants acme and globex, an admin and two users each, with preferences."""

from __future__ import annotations

import json
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from tenants import actions
from tenants.models import Tenant

SEED = {
    "acme": ("Acme Corp", [
        ("alice", "I am vegetarian and I do not like spicy food."),
        ("bob", "I love hiking and prefer short, direct answers."),
    ]),
    "globex": ("Globex Inc", [
        ("carol", "I am vegan, allergic to nuts, and I enjoy Italian cooking."),
        ("dave", "I travel by train and prefer quiet hotels near the station."),
    ]),
}


class Command(BaseCommand):
    help = "Create the demo tenants/users (idempotent) and print fresh API tokens."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print tokens as JSON.")

    @transaction.atomic
    def handle(self, *args, **opts):
        out = {"superuser": self._superuser(), "tokens": {}}
        for slug, (name, users) in SEED.items():
            tenant = Tenant.objects.filter(slug=slug).first() or actions.do_create_tenant(slug, name)
            admin_name = f"{slug}-admin"
            admin = self._member(tenant, admin_name, admin=True, password=f"{slug}-admin-pw")
            out["tokens"][admin_name] = actions.do_create_api_token(admin)
            for username, pref in users:
                member = self._member(tenant, username, preference=pref)
                out["tokens"][username] = actions.do_create_api_token(member)
        self.stdout.write(json.dumps(out) if opts["json"] else self._pretty(out))

    def _member(self, tenant, username, **kw):
        user = get_user_model().objects.filter(username=username).first()
        if user is not None:
            return user.member
        return actions.do_add_member(tenant, username, **kw)

    def _superuser(self) -> dict:
        User = get_user_model()
        path = settings.VAR_DIR / "secrets" / "admin-password"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(12))
        password = path.read_text().strip()
        user = User.objects.filter(username="admin").first()
        if user is None:
            User.objects.create_superuser("admin", "admin@example.com", password)
        return {"username": "admin", "password": password}

    def _pretty(self, out) -> str:
        su = out["superuser"]
        lines = [f"superuser: {su['username']} / {su['password']}",
                 "tenant admins: acme-admin / acme-admin-pw, globex-admin / globex-admin-pw"]
        lines += [f"token {name:<14} {key}" for name, key in out["tokens"].items()]
        return "\n".join(lines)
