"""CacheKeySigner: names differ on every input, never leak slugs, need the secret."""

from __future__ import annotations

import fnmatch
import itertools

import pytest

from injection.base import CacheKey
from injection.kvcache.signing import CacheKeySigner

SECRET = "test-secret-0123456789abcdef"
KEY = CacheKey("acme-corp", "user-42", "c0ffee" * 8, "fp-llama-bf16")


def signer(**kw) -> CacheKeySigner:
    return CacheKeySigner(kw.pop("secret", SECRET), **kw)


def test_key_is_deterministic_and_well_formed():
    s = signer()
    name = s.redis_key(KEY)
    assert name == signer().redis_key(KEY)
    ns, tag, kind, digest = name.split(":")
    assert (ns, kind) == ("kvi", "e") and len(tag) == 32 and len(digest) == 64
    assert name.startswith(s.tenant_prefix(KEY.tenant))
    assert s.tag_of(name) == tag == s.tenant_tag(KEY.tenant)


@pytest.mark.parametrize("field", CacheKey._fields)
def test_every_key_field_changes_the_name(field):
    s = signer()
    other = KEY._replace(**{field: getattr(KEY, field) + "x"})
    assert s.redis_key(other) != s.redis_key(KEY)


def test_secret_generation_and_namespace_change_everything():
    base = signer()
    for other in (
        signer(secret=SECRET + "!"),
        signer(key_generation="1"),
    ):
        assert other.redis_key(KEY) != base.redis_key(KEY)
        assert other.tenant_prefix(KEY.tenant) != base.tenant_prefix(KEY.tenant)
        assert other.user_index_key(KEY.tenant, KEY.user) != base.user_index_key(
            KEY.tenant, KEY.user
        )
        assert other.mac(KEY.tenant, b"data") != base.mac(KEY.tenant, b"data")
        assert not other.verify(KEY.tenant, b"data", base.mac(KEY.tenant, b"data"))
    ns = base.with_namespace("other")
    assert ns.redis_key(KEY).startswith("other:") and base.with_namespace("kvi") is base
    assert ns.redis_key(KEY).split(":", 1)[1] == base.redis_key(KEY).split(":", 1)[1]


def test_secret_as_str_or_bytes_is_the_same_secret():
    assert signer(secret=SECRET.encode()).redis_key(KEY) == signer().redis_key(KEY)


def test_no_separator_ambiguity_between_fields():
    s = signer()
    a = CacheKey("t", "ab", "c", "fp")
    b = CacheKey("t", "a", "bc", "fp")
    assert s.redis_key(a) != s.redis_key(b)
    assert s.tenant_tag("ab") != s.tenant_tag("a")


def test_slugs_and_user_ids_never_appear_in_names():
    s = signer()
    names = [
        s.redis_key(KEY),
        s.tenant_prefix(KEY.tenant),
        s.user_index_key(KEY.tenant, KEY.user),
        s.entry_match(KEY.tenant),
    ]
    # (plain hex like "42" can occur by chance inside a digest; slugs with non-hex letters cannot)
    for name, secret_part in itertools.product(names, ("acme", "corp", "user", "user-42", "llama")):
        assert secret_part not in name


def test_tenant_prefix_selects_exactly_one_tenant():
    s = signer()
    tenants = ["a", "ab", "acme", "acme-corp", "b"]
    names = {t: [s.redis_key(KEY._replace(tenant=t, user=u)) for u in "xyz"] for t in tenants}
    indexes = {t: s.user_index_key(t, "x") for t in tenants}
    for t in tenants:
        prefix, match = s.tenant_prefix(t), s.entry_match(t)
        for other in tenants:
            hit = all(n.startswith(prefix) for n in names[other])
            assert hit == (other == t)
            assert indexes[other].startswith(prefix) == (other == t)
            assert all(fnmatch.fnmatchcase(n, match) == (other == t) for n in names[other])
            assert not fnmatch.fnmatchcase(indexes[other], match)  # indexes are not entries
    every = s.entry_match(None)
    assert all(fnmatch.fnmatchcase(n, every) for ns in names.values() for n in ns)


def test_user_index_differs_per_user_and_tenant():
    s = signer()
    idx = {s.user_index_key(t, u) for t in ("a", "b") for u in ("1", "2")}
    assert len(idx) == 4


def test_mac_verify_constant_time_api():
    s = signer()
    tag = s.mac("acme", b"payload")
    assert len(tag) == 32 and s.verify("acme", b"payload", tag)
    assert not s.verify("acme", b"payloaD", tag)
    assert not s.verify("globex", b"payload", tag)  # per-tenant MAC keys
    assert s.mac_parts(s.tenant_tag("acme"), (b"pay", b"load")) == tag


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"secret": "short"}, "16 bytes"),
        ({"key_generation": "a:b"}, "key_generation"),
        ({"key_generation": ""}, "key_generation"),
        ({"namespace": "kv*"}, "namespace"),
        ({"namespace": "a:b"}, "namespace"),
    ],
)
def test_constructor_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        signer(**kwargs)


def test_empty_user_or_tenant_is_refused():
    s = signer()
    with pytest.raises(ValueError):
        s.redis_key(KEY._replace(user=""))
    with pytest.raises(ValueError):
        s.tenant_prefix("")


def test_tag_of_rejects_foreign_names():
    s = signer()
    for bad in ("kvi:zz:e:00", "other:" + "0" * 32 + ":e:00", "kvi:" + "0" * 32, "garbage"):
        with pytest.raises(ValueError):
            s.tag_of(bad)


def test_parse_name_knows_entries_and_indexes_of_any_generation_only():
    a, b = CacheKeySigner(SECRET), CacheKeySigner(SECRET, key_generation="9")
    entry = b.redis_key(CacheKey("acme", "u1", "h", "fp"))
    index = a.user_index_key("acme", "u1")
    assert a.parse_name(entry) == (b.tenant_tag("acme"), "e")
    assert a.parse_name(index.encode()) == (a.tenant_tag("acme"), "u")
    for other in ("kvi:keygen", "kvi:rl:chat:m:1:5", entry + "x", "zzz" + entry[3:]):
        assert a.parse_name(other) is None
    assert a.with_namespace("other").parse_name(entry) is None
