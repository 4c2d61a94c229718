"""Secrets and the web's transport settings, from the environment.

* ``read_secrets``: DJANGO_SECRET_KEY and KV_SIGNING_SECRET (required with DEBUG off);
* ``settings``: the secrets' rotation fallbacks, the web behind a TLS proxy, static files
  (docs/OPERATIONS.md: "Behind a TLS proxy", "Rotating secrets"; every variable with its
  default in platform/example.env);
* ``secrets_accepted``/``derived_keys``/``matches``: every message one platform process
  authenticates for another (task messages, control requests, stream entries) is signed
  with the current KV secret alone and verified against it, then each of
  ``KV_SIGNING_SECRET_FALLBACKS``: processes on either side of a rotation understand each
  other while it rolls out.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

from config.envvars import env_bool, env_int, env_list


def _dev_secret(var_dir: Path, name: str) -> str:
    """In DEBUG, a per-checkout random secret under var/."""
    path = var_dir / "secrets" / name
    if path.exists():
        return path.read_text().strip()
    import secrets
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(48)
    path.write_text(value)
    path.chmod(0o600)
    return value


def read_secrets(debug: bool, var_dir: Path) -> tuple[str, str]:
    """DJANGO_SECRET_KEY and KV_SIGNING_SECRET: required when DEBUG is off."""
    out = []
    for name, dev in (("DJANGO_SECRET_KEY", "django"), ("KV_SIGNING_SECRET", "kv")):
        value = os.environ.get(name) or (_dev_secret(var_dir, dev) if debug else "")
        if not value:
            raise RuntimeError(f"{name} must be set when DJANGO_DEBUG is off")
        out.append(value)
    return out[0], out[1]


def settings(var_dir: Path) -> dict[str, Any]:
    """The Django settings this module owns (settings.py applies them to its globals)."""
    # on: a request the proxy marks "X-Forwarded-Proto: https" is secure. The proxy must set
    # that header itself on every request (never pass a client's through).
    behind_tls_proxy = env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False)
    secure_cookies = env_bool("DJANGO_SECURE_COOKIES", behind_tls_proxy)
    out: dict[str, Any] = {
        # earlier keys that still verify (never sign) while a rotation rolls out
        "SECRET_KEY_FALLBACKS": env_list("DJANGO_SECRET_KEY_FALLBACKS"),
        "KV_SIGNING_SECRET_FALLBACKS": env_list("KV_SIGNING_SECRET_FALLBACKS"),
        # public origins the admin's forms are posted from (https://chat.example.com): CSRF
        # accepts a POST whose Origin is one of them, or is the request's own scheme://host
        "CSRF_TRUSTED_ORIGINS": env_list("DJANGO_CSRF_TRUSTED_ORIGINS"),
        "SESSION_COOKIE_SECURE": secure_cookies,
        "CSRF_COOKIE_SECURE": secure_cookies,
        # Strict-Transport-Security on https responses (0: none)
        "SECURE_HSTS_SECONDS": env_int("DJANGO_HSTS_SECONDS", 0),
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False),
        # collected at image build (platform/Dockerfile); with DEBUG off the web serves them
        # under STATIC_URL itself unless DJANGO_SERVE_STATIC=0 (the ingress or a CDN does)
        "STATIC_ROOT": Path(os.environ.get("DJANGO_STATIC_ROOT") or var_dir / "static"),
        "SERVE_STATIC": env_bool("DJANGO_SERVE_STATIC", True),
    }
    if behind_tls_proxy:
        out["SECURE_PROXY_SSL_HEADER"] = ("HTTP_X_FORWARDED_PROTO", "https")
    return out


def secrets_accepted() -> list[bytes]:
    """The current secret first, then the fallbacks (duplicates dropped)."""
    from django.conf import settings

    out: list[bytes] = []
    for s in (settings.KV_SIGNING_SECRET, *getattr(settings, "KV_SIGNING_SECRET_FALLBACKS", ())):
        b = s.encode()
        if b and b not in out:
            out.append(b)
    return out


def derived_keys(context: bytes) -> list[bytes]:
    """``HMAC(secret, context)`` for every accepted secret; the first is the signing key."""
    return [hmac.new(s, context, hashlib.sha256).digest() for s in secrets_accepted()]


def matches(keys: list[bytes], body: bytes, mac_hex: str) -> bool:
    """Whether ``mac_hex`` is the HMAC-SHA256 of ``body`` under any of ``keys``."""
    return any(hmac.compare_digest(hmac.new(k, body, hashlib.sha256).hexdigest(), mac_hex)
               for k in keys)
