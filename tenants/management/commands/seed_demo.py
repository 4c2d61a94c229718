"""Demo seed: tenants acme and globex, an admin and two users each, with preferences."""

from __future__ import annotations

import json
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenants import actions
from tenants.models import ApiToken, Tenant
from tenants.origin import CliCommandMixin

DEMO_TOKEN_NAME = "demo"
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


def _tokens_file():
    return settings.VAR_DIR / "secrets" / "demo-tokens.json"


def _saved_tokens() -> dict[str, str]:
    try:
        return json.loads(_tokens_file().read_text())
    except (OSError, ValueError):
        return {}


def _save_tokens(tokens: dict[str, str]) -> None:
    path = _tokens_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(tokens))
    tmp.chmod(0o600)
    tmp.replace(path)


def _demo_token(member, key: str | None) -> str:
    """The member's demo key of the last run while it still works; otherwise the old demo
    tokens are revoked and one new key is minted (so runs never pile up live tokens)."""
    live = ApiToken.objects.filter(member=member, name=DEMO_TOKEN_NAME, revoked=False)
    if key and live.filter(key_hash=ApiToken.hash_key(key)).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())).exists():
        return key
    for token in live:
        actions.do_revoke_api_token(token)
    return actions.do_create_api_token(member, name=DEMO_TOKEN_NAME)


class Command(CliCommandMixin, BaseCommand):
    help = "Create the demo tenants/users (idempotent) and print their API tokens (the same " \
           "keys on every run, kept in VAR_DIR/secrets/demo-tokens.json)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print tokens as JSON.")

    @transaction.atomic
    def handle(self, *args, **opts):
        out = {"superuser": self._superuser(), "tokens": {}}
        for slug, (name, users) in SEED.items():
            tenant = Tenant.objects.filter(slug=slug).first() or actions.do_create_tenant(slug, name)
            admin_name = f"{slug}-admin"
            admin = self._member(tenant, admin_name, admin=True, password=f"{slug}-admin-pw")
            saved = _saved_tokens()
            out["tokens"][admin_name] = _demo_token(admin, saved.get(admin_name))
            for username, pref in users:
                member = self._member(tenant, username, preference=pref)
                out["tokens"][username] = _demo_token(member, saved.get(username))
        _save_tokens(out["tokens"])
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
