"""Test settings.

Each pytest process gets its own test database and its own Redis db (broker, results; and
the same db number on the cache Redis for L2), so a running `make demo` (db 0), the
processes of one `pytest -n 2` run and concurrent test runs never consume each other's
tasks. Worker subprocesses inherit KVI_TEST_REDIS_DB from the environment.
"""

import os
from urllib.parse import urlparse, urlunparse

from config.envvars import env_bool
from config.settings import *  # noqa: F403
from config.settings import DATABASES
from config.settings import KV_CACHE_REDIS_URL as _BASE_CACHE_URL
from config.settings import REDIS_URL as _BASE_REDIS_URL

# db 0: demo; 9, 15, 14, 13: engine unit tests (tests/conftest.py, one per pytest process
# of a run); the others: test runs.
_FREE_DBS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12]
_XDIST = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... under `pytest -n N`
if _XDIST:  # the processes of one run (same run id) take consecutive dbs, distinct
    _run = int(os.environ.get("PYTEST_XDIST_TESTRUNUID", "0")[:6] or "0", 16)
    os.environ["KVI_TEST_REDIS_DB"] = str(_FREE_DBS[(_run + int(_XDIST[2:])) % len(_FREE_DBS)])
os.environ.setdefault("KVI_TEST_REDIS_DB", str(_FREE_DBS[os.getpid() % len(_FREE_DBS)]))
TEST_REDIS_DB = int(os.environ["KVI_TEST_REDIS_DB"])
REDIS_URL = urlunparse(urlparse(_BASE_REDIS_URL)._replace(path=f"/{TEST_REDIS_DB}"))
KV_CACHE_REDIS_URL = urlunparse(urlparse(_BASE_CACHE_URL)._replace(path=f"/{TEST_REDIS_DB}"))
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
DATABASES["default"]["TEST"] = {"NAME": f"test_kvi_{TEST_REDIS_DB}"}
CHAT_RESULT_TIMEOUT = 120.0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users
# Tests run on the fast random-weight demo model unless MODEL_PATH is set; tests of the
# real default model ask for it explicitly (fixture real_model_path, marker real_model).
DEFAULT_MODEL = "demo"
# Tests never depend on wall-clock speed: paced prefill chunks are sized from measured
# times, so the test workers prefill in fixed chunks (pacing itself is tested with an
# injected clock, tests/injection/test_pacing.py).
WORKER_PREFILL_PACE = 0.0
# An edit warms its member in the background (KV_WARM_ON_EDIT): off here, so a test that
# edits and then chats sees the tier it asserts, not a race with the warm; the tests of the
# warm turn it on (tests/tenants/test_warm_on_edit.py, tests/e2e/test_invalidation.py).
KV_WARM_ON_EDIT = env_bool("KV_WARM_ON_EDIT", False)
