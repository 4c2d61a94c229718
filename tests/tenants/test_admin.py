"""The scoped Django admin: a tenant admin sees and edits only their own tenant, every write
is audited through actions, the audit log is read-only, and foreign objects are 404/403
with nothing of theirs in the page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.models import ApiToken, AuditEvent, AuditLog, Member, Preference, Tenant
from tests.tenants.conftest import admin_client

pytestmark = pytest.mark.django_db
User = get_user_model()

# Strings that only exist in globex's data: none may appear on an acme admin's page.
GLOBEX_SECRETS = (b"globex-user", b"globex-admin", b"globex-other", b"globex-secret",
                  b"globex private", b"globex other secret")


def assert_no_leak(response) -> None:
    for secret in GLOBEX_SECRETS:
        assert secret not in response.content, secret


@pytest.fixture
def acme_admin(acme, globex) -> Client:
    return admin_client("acme-admin", "pw-admin-123")


@pytest.fixture
def root(superuser, acme, globex) -> Client:
    return admin_client("root", "pw-root-123")


def globex_objects(globex) -> dict[str, int]:
    return {
        "tenant": globex.tenant.pk,
        "member": globex.user.pk,
        "preference": globex.user.preference.pk,
        "apitoken": globex.user.api_tokens.get().pk,
        "auditlog": AuditLog.objects.filter(tenant=globex.tenant).first().pk,
    }


# --- what a tenant admin sees ----------------------------------------------------------


@pytest.mark.parametrize("model", ["tenant", "member", "preference", "apitoken", "auditlog"])
def test_changelists_show_only_own_tenant(acme_admin, acme, model):
    response = acme_admin.get(f"/admin/tenants/{model}/")
    assert response.status_code == 200
    assert_no_leak(response)
    if model in ("member", "preference", "apitoken"):
        assert b"acme-user" in response.content
    # Filtering or searching for the other tenant cannot widen the scope (400: lookup
    # not allowed; 302: Django's "invalid filter" redirect; 200: filtered to nothing).
    acme_admin.raise_request_exception = False
    for query in ("?q=globex", f"?tenant__id__exact={Tenant.objects.get(slug='globex').pk}",
                  "?member__tenant__slug=globex"):
        response = acme_admin.get(f"/admin/tenants/{model}/{query}")
        assert response.status_code in (200, 302, 400)
        assert_no_leak(response)


@pytest.mark.parametrize("model", ["tenant", "member", "preference", "apitoken", "auditlog"])
def test_foreign_object_pages_are_404(acme_admin, globex, model):
    pk = globex_objects(globex)[model]
    for suffix in ("change/", "delete/", "history/"):
        response = acme_admin.get(f"/admin/tenants/{model}/{pk}/{suffix}")
        assert response.status_code == 404, (suffix, response.status_code)
        assert_no_leak(response)
    response = acme_admin.post(f"/admin/tenants/{model}/{pk}/delete/", {"post": "yes"})
    assert response.status_code in (403, 404)
    response = acme_admin.post(f"/admin/tenants/{model}/{pk}/change/", {"text": "pwned"})
    assert response.status_code in (403, 404)
    assert globex_objects(globex)[model] == pk  # still there
    assert Preference.objects.get(member=globex.user).text == "globex-secret loves durian"


def test_index_lists_only_tenant_models(acme_admin):
    response = acme_admin.get("/admin/")
    assert response.status_code == 200
    assert b"/admin/tenants/preference/" in response.content
    assert b"/admin/auth/user/" not in response.content
    assert b"/admin/auth/group/" not in response.content


def test_users_and_groups_are_superuser_only(acme_admin, acme):
    for url in ("/admin/auth/user/", "/admin/auth/user/add/", "/admin/auth/group/",
                f"/admin/auth/user/{acme.user.user.pk}/change/"):
        assert acme_admin.get(url).status_code == 403, url
    response = acme_admin.post("/admin/auth/user/add/", {
        "username": "evil", "password1": "x-Long-pass-1", "password2": "x-Long-pass-1"})
    assert response.status_code == 403
    assert not User.objects.filter(username="evil").exists()


def test_autocomplete_is_scoped(acme_admin, acme, globex):
    for source, field in (("preference", "member"), ("apitoken", "member")):
        for term in ("", "globex", "user"):
            response = acme_admin.get("/admin/autocomplete/", {
                "app_label": "tenants", "model_name": source, "field_name": field,
                "term": term})
            assert response.status_code == 200
            ids = {int(r["id"]) for r in response.json()["results"]}
            assert ids <= set(Member.objects.filter(tenant=acme.tenant).values_list("pk",
                                                                                    flat=True))
            assert_no_leak(response)
    response = acme_admin.get("/admin/autocomplete/", {
        "app_label": "tenants", "model_name": "auditlog", "field_name": "tenant", "term": ""})
    assert {r["text"] for r in response.json()["results"]} <= {"acme"}
    # Users are only reachable by superusers.
    response = acme_admin.get("/admin/autocomplete/", {
        "app_label": "tenants", "model_name": "member", "field_name": "user", "term": ""})
    assert response.status_code == 403


def test_fk_pickers_refuse_foreign_members(acme_admin, acme, globex):
    # A forged POST naming globex's member is a form error, not a foreign write.
    Preference.objects.filter(member=globex.other).delete()
    response = acme_admin.post("/admin/tenants/preference/add/", {
        "member": globex.other.pk, "text": "injected", "enabled": "on", "alpha": "1.0"})
    assert response.status_code == 200 and b"Select a valid choice" in response.content
    assert not Preference.objects.filter(member=globex.other).exists()
    response = acme_admin.post("/admin/tenants/apitoken/add/", {"member": globex.user.pk})
    assert response.status_code == 200 and b"Select a valid choice" in response.content
    assert ApiToken.objects.filter(member=globex.user).count() == 1


def test_member_add_goes_to_own_tenant_whatever_is_posted(acme_admin, acme, globex):
    response = acme_admin.get("/admin/tenants/member/add/")
    assert b'name="tenant"' not in response.content
    response = acme_admin.post("/admin/tenants/member/add/", {
        "username": "acme-new", "password": "", "role": "user", "active": "on",
        "tenant": globex.tenant.pk})
    assert response.status_code == 302, response.content[:2000]
    member = Member.objects.get(user__username="acme-new")
    assert member.tenant == acme.tenant and not member.user.is_superuser
    row = AuditLog.objects.get(event_type=AuditEvent.MEMBER_CREATED, target="acme-new")
    assert row.tenant == acme.tenant and row.actor == acme.admin.user


def test_audit_log_filters_are_scoped(acme_admin, acme, globex):
    response = acme_admin.get("/admin/tenants/auditlog/")
    assert b"acme-admin" in response.content  # an actor in acme's log (its own login)
    assert_no_leak(response)
    response = acme_admin.get(f"/admin/tenants/auditlog/?actor__id__exact={globex.admin.user.pk}")
    assert_no_leak(response)
    response = acme_admin.get("/admin/tenants/auditlog/?event_type=member.created")
    assert response.status_code == 200 and b"acme-user" in response.content
    assert response.context["cl"].result_count == 3


# --- the audit log is read-only for everyone ----------------------------------------------


@pytest.mark.parametrize("who", ["acme_admin", "root"])
def test_audit_log_read_only(request, acme, who):
    client = request.getfixturevalue(who)
    row = AuditLog.objects.filter(tenant=acme.tenant).first()
    assert client.get(f"/admin/tenants/auditlog/{row.pk}/change/").status_code == 200
    assert client.get("/admin/tenants/auditlog/add/").status_code == 403
    assert client.post("/admin/tenants/auditlog/add/", {"target": "x"}).status_code == 403
    assert client.get(f"/admin/tenants/auditlog/{row.pk}/delete/").status_code == 403
    client.post(f"/admin/tenants/auditlog/{row.pk}/change/", {"target": "forged"})
    client.post("/admin/tenants/auditlog/", {"action": "delete_selected",
                                             "_selected_action": [row.pk], "post": "yes"})
    row.refresh_from_db()
    assert row.target != "forged"
    page = client.get(f"/admin/tenants/auditlog/{row.pk}/change/")
    assert b'name="_save"' not in page.content and b"/delete/" not in page.content
    changelist = client.get("/admin/tenants/auditlog/")
    assert b'name="action"' not in changelist.content  # no bulk actions at all


# --- writes are audited through actions ----------------------------------------------------


def test_preference_edit_shows_text_and_version_and_is_audited(acme_admin, acme):
    pref = acme.user.preference
    page = acme_admin.get(f"/admin/tenants/preference/{pref.pk}/change/")
    assert b"acme-secret vegetarian" in page.content and b"Version" in page.content
    response = acme_admin.post(f"/admin/tenants/preference/{pref.pk}/change/", {
        "text": "pescatarian", "enabled": "on", "alpha": "0.8", "seen_version": pref.version})
    assert response.status_code == 302
    pref.refresh_from_db()
    assert (pref.text, pref.version, pref.alpha) == ("pescatarian", 2, 0.8)
    row = AuditLog.objects.get(event_type=AuditEvent.PREFERENCE_CHANGED)
    assert row.actor == acme.admin.user and row.tenant == acme.tenant
    assert row.data["old"]["text"].startswith("acme-secret") and row.data["version"] == 2


def test_preference_edit_refuses_a_stale_version(acme_admin, acme):
    pref = acme.user.preference
    Preference.objects.filter(pk=pref.pk).update(text="changed via the API meanwhile")
    response = acme_admin.post(f"/admin/tenants/preference/{pref.pk}/change/", {
        "text": "editor's text", "enabled": "on", "alpha": "1.0", "seen_version": 1})
    assert response.status_code == 200 and b"changed elsewhere" in response.content
    pref.refresh_from_db()
    assert pref.text == "changed via the API meanwhile"


def test_preference_add_delete_and_bulk_actions_audited(acme_admin, acme):
    Preference.objects.filter(member=acme.admin).delete()
    response = acme_admin.post("/admin/tenants/preference/add/", {
        "member": acme.admin.pk, "text": "tea", "enabled": "on", "alpha": "1.0"})
    assert response.status_code == 302
    created = Preference.objects.get(member=acme.admin)
    assert created.tenant == acme.tenant
    pks = list(Preference.objects.filter(tenant=acme.tenant).values_list("pk", flat=True))
    acme_admin.post("/admin/tenants/preference/", {"action": "disable_injection",
                                                  "_selected_action": pks})
    assert not Preference.objects.filter(tenant=acme.tenant, enabled=True).exists()
    assert AuditLog.objects.filter(event_type=AuditEvent.PREFERENCE_CHANGED,
                                   actor=acme.admin.user).count() == len(pks)
    response = acme_admin.post(f"/admin/tenants/preference/{created.pk}/delete/",
                               {"post": "yes"})
    assert response.status_code == 302
    row = AuditLog.objects.get(event_type=AuditEvent.PREFERENCE_DELETED)
    assert row.data["old"]["text"] == "tea" and row.actor == acme.admin.user


def test_member_change_and_delete_audited(acme_admin, acme, globex):
    response = acme_admin.post(f"/admin/tenants/member/{acme.other.pk}/change/", {
        "role": "admin", "active": "on", "tenant": Tenant.objects.get(slug="globex").pk,
        "user": acme.admin.user.pk})
    assert response.status_code == 302
    acme.other.refresh_from_db()
    assert acme.other.tenant == acme.tenant  # tenant and user are not editable
    assert acme.other.user.username == "acme-other"
    acme.other.user.refresh_from_db()
    assert acme.other.role == "admin" and acme.other.user.is_staff
    row = AuditLog.objects.get(event_type=AuditEvent.MEMBER_CHANGED)
    assert row.data == {"old": {"role": "user", "active": True},
                        "new": {"role": "admin", "active": True}}
    response = acme_admin.post(f"/admin/tenants/member/{acme.other.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302, response.content[:3000]
    assert not Member.objects.filter(pk=acme.other.pk).exists()
    assert not User.objects.filter(username="acme-other").exists()
    row = AuditLog.objects.get(event_type=AuditEvent.MEMBER_DELETED)
    assert row.actor == acme.admin.user and row.data["preference"]["text"] == "acme other secret"
    # A tenant admin cannot delete themselves.
    assert acme_admin.get(f"/admin/tenants/member/{acme.admin.pk}/delete/").status_code == 403


def test_tenant_admin_edits_own_tenant_but_not_its_active_flag(acme_admin, acme):
    response = acme_admin.post(f"/admin/tenants/tenant/{acme.tenant.pk}/change/", {
        "name": "Acme Corp", "audit_message_text": "on", "active": ""})
    assert response.status_code == 302
    acme.tenant.refresh_from_db()
    assert acme.tenant.name == "Acme Corp" and acme.tenant.audit_message_text
    assert acme.tenant.active  # read-only for tenant admins
    row = AuditLog.objects.get(event_type=AuditEvent.TENANT_CHANGED)
    assert row.data["new"] == {"name": "Acme Corp", "audit_message_text": True}
    assert acme_admin.get("/admin/tenants/tenant/add/").status_code == 403


def test_clear_and_warm_actions_audited_and_scoped(acme_admin, acme, globex):
    response = acme_admin.post("/admin/tenants/member/", {
        "action": "clear_kv_cache", "_selected_action": [acme.user.pk, globex.user.pk]})
    assert response.status_code == 302
    rows = AuditLog.objects.filter(event_type=AuditEvent.CACHE_CLEARED)
    assert [(r.tenant_id, r.target) for r in rows] == [(acme.tenant.pk, "acme/acme-user")]


def test_warm_action_audited_and_scoped(acme_admin, acme, globex,
                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        acme_admin.post("/admin/tenants/member/", {
            "action": "warm_kv_cache",
            "_selected_action": [acme.user.pk, acme.admin.pk, globex.user.pk]}, follow=True)
    warmed = AuditLog.objects.filter(event_type=AuditEvent.CACHE_WARMED)
    # acme-admin has no preference: nothing to warm; globex is out of scope.
    assert [(r.tenant_id, r.target) for r in warmed] == [(acme.tenant.pk, "acme/acme-user")]
    assert warmed.get().data["version"] == acme.user.preference.version
    assert len(callbacks) >= 1  # the task is enqueued on commit, not before


def test_token_issue_and_revoke(acme_admin, acme):
    response = acme_admin.post("/admin/tenants/apitoken/add/", {"member": acme.other.pk},
                               follow=True)
    assert b"shown only on this page" in response.content
    token = ApiToken.objects.filter(member=acme.other).order_by("-id").first()
    acme_admin.post("/admin/tenants/apitoken/", {"action": "revoke",
                                                "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked
    assert AuditLog.objects.filter(event_type=AuditEvent.TOKEN_REVOKED,
                                   actor=acme.admin.user).count() == 1


# --- who gets in ------------------------------------------------------------------------


def test_superuser_sees_every_tenant(root):
    response = root.get("/admin/tenants/member/")
    assert b"acme-user" in response.content and b"globex-user" in response.content
    assert root.get("/admin/auth/user/").status_code == 200


@pytest.mark.parametrize("demote", ["role", "member_inactive", "tenant_inactive"])
def test_staff_without_tenant_admin_role_sees_nothing(acme, globex, demote):
    from tenants import actions

    client = admin_client("acme-admin", "pw-admin-123")
    if demote == "role":
        Member.objects.filter(pk=acme.admin.pk).update(role="user")  # staff flag left behind
    elif demote == "member_inactive":
        actions.do_change_member(acme.admin, active=False)
    else:
        actions.do_update_tenant(acme.tenant, active=False)
    for url in ("/admin/tenants/member/", "/admin/tenants/auditlog/",
                f"/admin/tenants/member/{acme.user.pk}/change/"):
        assert client.get(url).status_code in (403, 404), url


def test_plain_members_cannot_use_the_admin(acme):
    client = admin_client("acme-user", "pw-user-123")
    response = client.get("/admin/tenants/member/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_logins_are_audited(acme, superuser):
    admin_client("acme-admin", "pw-admin-123")
    admin_client("root", "pw-root-123")
    rows = {r.actor.username: r for r in AuditLog.objects.filter(
        event_type=AuditEvent.ADMIN_LOGIN)}
    assert rows["acme-admin"].tenant == acme.tenant
    assert rows["root"].tenant is None and rows["root"].data["superuser"] is True
    # Through the real admin login form as well.
    client = Client()
    response = client.post("/admin/login/?next=/admin/", {"username": "acme-admin",
                                                          "password": "pw-admin-123"})
    assert response.status_code == 302
    assert AuditLog.objects.filter(event_type=AuditEvent.ADMIN_LOGIN,
                                   actor=acme.admin.user).count() == 2


def test_failed_logins_are_audited_without_the_password(acme):
    client = Client()
    for username in ("acme-admin", "nobody-here"):
        response = client.post("/admin/login/?next=/admin/", {"username": username,
                                                              "password": "wrong-pw-42"})
        assert response.status_code == 200  # the form again, not a redirect
    rows = {r.target: r for r in AuditLog.objects.filter(
        event_type=AuditEvent.ADMIN_LOGIN_FAILED)}
    assert rows["acme-admin"].tenant == acme.tenant and rows["acme-admin"].actor is None
    assert rows["nobody-here"].tenant is None and rows["nobody-here"].data["known_user"] is False
    assert all("wrong-pw-42" not in str(r.data) for r in rows.values())


# --- every page renders for the roles that may see it ---------------------------------------


def own_pages(world) -> list[str]:
    pref = world.user.preference
    token = world.user.api_tokens.get()
    log = AuditLog.objects.filter(tenant=world.tenant).first()
    pages = ["/admin/", "/admin/tenants/"]
    for model, pk in (("tenant", world.tenant.pk), ("member", world.user.pk),
                      ("preference", pref.pk), ("apitoken", token.pk), ("auditlog", log.pk)):
        pages += [f"/admin/tenants/{model}/", f"/admin/tenants/{model}/{pk}/change/",
                  f"/admin/tenants/{model}/{pk}/history/"]
    pages += ["/admin/tenants/member/add/", "/admin/tenants/preference/add/",
              "/admin/tenants/apitoken/add/", f"/admin/tenants/member/{world.user.pk}/delete/",
              f"/admin/tenants/preference/{pref.pk}/delete/"]
    return pages


@pytest.mark.parametrize("who", ["acme_admin", "root"])
def test_every_own_page_renders(request, acme, who):
    client = request.getfixturevalue(who)
    for url in own_pages(acme):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        if who == "acme_admin":
            assert_no_leak(response)


def test_superuser_pages_and_audited_account_changes(root, acme, superuser):
    for url in ("/admin/tenants/tenant/add/", "/admin/auth/user/",
                f"/admin/auth/user/{acme.user.user.pk}/change/", "/admin/auth/group/"):
        assert root.get(url).status_code == 200, url
    response = root.post("/admin/tenants/tenant/add/", {
        "slug": "initech", "name": "Initech", "active": "on"})
    assert response.status_code == 302
    assert AuditLog.objects.get(event_type=AuditEvent.TENANT_CREATED,
                                target="initech").actor == superuser
    response = root.post("/admin/tenants/tenant/add/", {"slug": "BadSlug", "name": "x"})
    assert response.status_code == 200 and b"lowercase" in response.content
    response = root.post("/admin/tenants/member/add/", {
        "tenant": acme.tenant.pk, "username": "acme-boss", "password": "pw-boss-123",
        "role": "admin", "active": "on"})
    assert response.status_code == 302
    boss = Member.objects.get(user__username="acme-boss")
    assert boss.tenant == acme.tenant and boss.user.is_staff and not boss.user.is_superuser
    # Deleting a member's user in Django's user admin is the audited member deletion.
    response = root.post(f"/admin/auth/user/{acme.other.user.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    row = AuditLog.objects.get(event_type=AuditEvent.MEMBER_DELETED)
    assert row.tenant == acme.tenant and row.actor == superuser
    assert not Member.objects.filter(pk=acme.other.pk).exists()


# --- the "view on site" shortcut (issue 9, finding 9) -----------------------------------


def _view_on_site(client, obj_or_model, pk) -> tuple[int, bytes]:
    from django.contrib.contenttypes.models import ContentType

    tail = f"r/{ContentType.objects.get_for_model(obj_or_model).pk}/{pk}/"
    response = client.get(f"/admin/{tail}")
    return response.status_code, response.content.replace(tail.encode(), b"<url>")


@pytest.mark.parametrize("model", ["tenant", "member", "preference", "apitoken", "auditlog"])
def test_view_on_site_confirms_no_ids(acme_admin, acme, globex, settings, model):
    settings.DEBUG = True  # the debug 404 page says why an object was not found
    models = {"tenant": Tenant, "member": Member, "preference": Preference,
              "apitoken": ApiToken, "auditlog": AuditLog}
    foreign = _view_on_site(acme_admin, models[model], globex_objects(globex)[model])
    missing = _view_on_site(acme_admin, models[model], 10**9)
    assert foreign[0] == missing[0] == 404
    assert foreign[1] == missing[1]  # the same answer: the id is not confirmed
    assert b"get_absolute_url" not in foreign[1] and b"doesn't exist" not in foreign[1]
    own = _view_on_site(acme_admin, Member, acme.user.pk)
    assert own[0] == 404 and own[1] == missing[1]  # off for tenant admins altogether
