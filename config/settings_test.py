"""Test settings: the suite's broker, results and L2 entries live on their own Redis db,
so a running `make demo` (db 0) and the tests never consume each other's tasks."""

from urllib.parse import urlparse, urlunparse

from config.settings import *  # noqa: F403
from config.settings import REDIS_URL as _BASE_REDIS_URL

TEST_REDIS_DB = 1
REDIS_URL = urlunparse(urlparse(_BASE_REDIS_URL)._replace(path=f"/{TEST_REDIS_DB}"))
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CHAT_RESULT_TIMEOUT = 120.0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users
