"""Operator commands: ``tenant create|adduser|deluser|token|budget|list``."""

from __future__ import annotations

import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenants import actions
from tenants.errors import PlatformError
from tenants.models import Member, Tenant
from tenants.origin import CliCommandMixin
from tenants.usage import billing


class Command(CliCommandMixin, BaseCommand):
    help = "Manage tenants and their members."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a tenant.")
        create.add_argument("slug")
        create.add_argument("--name", default="")
        add = sub.add_parser("adduser", help="Add a user to a tenant; prints the API token last.")
        add.add_argument("slug")
        add.add_argument("username")
        add.add_argument("--admin", action="store_true", help="Tenant admin (scoped Django admin).")
        add.add_argument("--password", default=None, help="Password for the admin site.")
        add.add_argument("--preference", default=None, help="Initial preference text.")
        dele = sub.add_parser("deluser", help="Delete a member of a tenant and its account "
                              "(memories, tokens, conversations and cached K/V go too; audited).")
        dele.add_argument("slug")
        dele.add_argument("username")
        tok = sub.add_parser("token", help="Mint a new API token for a member (printed last); "
                             "--revoke-all first revokes the member's existing tokens.")
        tok.add_argument("slug")
        tok.add_argument("username")
        tok.add_argument("--revoke-all", action="store_true")
        tok.add_argument("--name", default="", help="What the token is for (shown in the admin).")
        tok.add_argument("--expires-days", type=float, default=None,
                         help="Refuse the token after this many days (default: never).")
        bud = sub.add_parser("budget", help="Set (--tokens/--period) or remove (--clear) the "
                             "token budget of a tenant, or of one member (--member); "
                             "neither: show the budgets and their spend this period.")
        bud.add_argument("slug")
        bud.add_argument("--member", default=None, help="Username: a member's own budget.")
        bud.add_argument("--tokens", type=int, default=None,
                         help="Tokens (prompt + completion) allowed per period.")
        bud.add_argument("--period", choices=actions.BUDGET_PERIODS, default="month",
                         help="UTC day or calendar month (default: month).")
        bud.add_argument("--clear", action="store_true", help="Remove the budget.")
        lst = sub.add_parser("list", help="List tenants.")
        lst.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        try:
            getattr(self, f"_{opts['action']}")(opts)
        except PlatformError as exc:
            raise CommandError(exc.message) from exc

    def _create(self, opts):
        tenant = actions.do_create_tenant(opts["slug"], opts["name"])
        self.stdout.write(f"created tenant {tenant.slug} ({tenant.name})")

    def _adduser(self, opts):
        tenant = actions.get_tenant(opts["slug"])
        member = actions.do_add_member(
            tenant, opts["username"], admin=opts["admin"], password=opts["password"],
            preference=opts["preference"],
        )
        key = actions.do_create_api_token(member)
        self.stdout.write(f"added {member} role={member.role}")
        self.stdout.write(key)

    def _deluser(self, opts):
        member = self._member(actions.get_tenant(opts["slug"]), opts["username"])
        name = str(member)
        actions.do_delete_member(member)
        self.stdout.write(f"deleted {name}")

    def _token(self, opts):
        tenant = actions.get_tenant(opts["slug"])
        member = self._member(tenant, opts["username"])
        if opts["revoke_all"]:
            for token in member.api_tokens.filter(revoked=False):
                actions.do_revoke_api_token(token)
        days = opts["expires_days"]
        if days is not None and days <= 0:
            raise CommandError("--expires-days must be more than 0.")
        expires = timezone.now() + timedelta(days=days) if days is not None else None
        self.stdout.write(actions.do_create_api_token(member, name=opts["name"],
                                                      expires_at=expires))

    def _member(self, tenant, username: str) -> Member:
        member = Member.objects.filter(tenant=tenant, user__username=username).first()
        if member is None:  # tenant-scoped: a user of another tenant is unknown here
            raise CommandError(f"Unknown user {username!r} in tenant {tenant.slug!r}.")
        return member

    def _budget(self, opts):
        tenant = actions.get_tenant(opts["slug"])
        member = self._member(tenant, opts["member"]) if opts["member"] else None
        who = str(member) if member is not None else tenant.slug
        if opts["clear"]:
            removed = actions.do_clear_budget(tenant, member=member)
            self.stdout.write(f"removed the budget of {who}" if removed
                              else f"{who} had no budget")
            return
        if opts["tokens"] is None:  # no change asked: show the budgets and their spend
            for line in billing.budgets([tenant.pk]):
                if member is None or line["member"] == str(member):
                    who_ = line["member"] or f"{tenant.slug} (whole tenant)"
                    self.stdout.write(
                        f"{who_}: {line['spent']} of {line['tokens']} tokens spent this "
                        f"{line['period']} (since {line['period_start']}, {line['percent']}%), "
                        f"{line['reserved']} held by running chats")
            return
        budget = actions.do_set_budget(tenant, member=member, tokens=opts["tokens"],
                                       period=opts["period"])
        self.stdout.write(f"budget of {who}: {budget.tokens} tokens "
                          f"{budget.get_period_display()}")

    def _list(self, opts):
        rows = [
            {"slug": t.slug, "name": t.name, "active": t.active, "members": t.members.count()}
            for t in Tenant.objects.order_by("slug")
        ]
        if opts["json"]:
            self.stdout.write(json.dumps(rows))
            return
        for r in rows:
            state = "active" if r["active"] else "inactive"
            self.stdout.write(f"{r['slug']:<24} {r['members']:>5} members  {state}  {r['name']}")
