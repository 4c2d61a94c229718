"""The web process never loads the model stack: chat dispatch and K/V invalidation run
without torch or transformers (seconds and hundreds of MB per web worker otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.workers import ROOT

SCRIPT = """
import sys
import django
django.setup()
import tenants.api.views, tenants.admin, gpu_worker.tasks
from gpu_worker.channels import kvstore
# real L2 evict + control-channel publish, for ids no test creates (tenant 1's K/V may
# be in the shared test Redis, left by whichever test ran before)
result = kvstore.invalidate(10**9 + 1, 10**9 + 2)
assert result["l2_deleted"] == 0, result
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
sys.exit(1 if heavy else 0)
"""


def test_web_request_and_invalidation_paths_do_not_import_the_model_stack(redis_url):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings_test"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "heavy: []" in proc.stdout
