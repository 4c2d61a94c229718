"""Two tenants with admins, users, preferences, tokens and conversations (real Postgres)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import redis
from django.conf import settings
from django.test import Client

from tenants import actions
from tenants.models import Conversation, Member, Message, Tenant


@dataclass
class World:
    tenant: Tenant
    admin: Member
    user: Member
    other: Member  # a second user of the same tenant
    admin_key: str
    user_key: str
    other_key: str
    conversation: Conversation


def clear_rate_limits() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter("kvi:rl:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    clear_rate_limits()
    yield
    clear_rate_limits()


def make_world(slug: str, pref: str) -> World:
    tenant = actions.do_create_tenant(slug, slug.title())
    admin = actions.do_add_member(tenant, f"{slug}-admin", admin=True, password="pw-admin-123")
    user = actions.do_add_member(tenant, f"{slug}-user", preference=pref, password="pw-user-123")
    other = actions.do_add_member(tenant, f"{slug}-other", preference=f"{slug} other secret")
    conv = Conversation.objects.create(tenant=tenant, member=user, title=f"{slug} dinner plans")
    Message.objects.create(tenant=tenant, conversation=conv, role="user",
                           content=f"{slug} private question", token_count=3)
    Message.objects.create(tenant=tenant, conversation=conv, role="assistant",
                           content=f"{slug} private answer", token_count=3)
    return World(tenant, admin, user, other, actions.do_create_api_token(admin),
                 actions.do_create_api_token(user), actions.do_create_api_token(other), conv)


@pytest.fixture
def acme(db) -> World:
    return make_world("acme", "acme-secret vegetarian, no spicy food")


@pytest.fixture
def globex(db) -> World:
    return make_world("globex", "globex-secret loves durian")


def token_client(key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Token {key}")


@pytest.fixture
def superuser(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")


def admin_client(username: str, password: str) -> Client:
    client = Client()
    assert client.login(username=username, password=password)
    return client
