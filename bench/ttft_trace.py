"""Wall-clock spans of named functions in a server process, for bench/profile_first_token.py.

``python bench/ttft_trace.py OUT.jsonl celery|uvicorn ARGS...`` runs the Celery worker or
uvicorn as ``servers.py`` would, with each function of ``TRACED`` (and of
``KVI_TRACE_MORE``, comma-separated ``module:Class.attr``) wrapped: every call appends
``{"fn", "t0", "t1", "th"}`` (``time.time()`` seconds, the thread's name) to ``OUT.jsonl``.
A bench-only tool: nothing of the platform imports it; the processes it starts are the
platform's own, unchanged but for these timers (about 10 us a call).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACED = [
    # web
    "tenants.v1.views:ChatCompletionsView.post",
    "gpu_worker.client.relay:start_chat",
    "gpu_worker.client.dispatch:claim_chat",
    "gpu_worker.client.dispatch:dispatch_chat",
    "tenants.budgets.estimate:prompt_estimate",
    "tenants.api.context_limits:completion_room",
    "gpu_worker.client.relay:_final",
    # worker: the task
    "gpu_worker.tasks:claim_is_live",
    "gpu_worker.serving.chat_service:answer",
    "gpu_worker.serving.chat_service:load_member",
    "gpu_worker.serving.chat_service:load_memories",
    "gpu_worker.serving.chat_service:recent_history",
    "gpu_worker.serving.chat_service:build_request",
    "gpu_worker.serving.chat_service:record",
    "gpu_worker.serving.chat_service:admit_prompt",
    "gpu_worker.serving.host:sync_key_generation",
    # engine
    "injection.engine.executor:InjectionExecutor._execute_once",
    "injection.engine.executor:InjectionExecutor._run",
    "injection.engine.planning.planner:TurnPlanner.plan",
    "injection.engine.planning.planner:TurnPlanner.system_turn",
    "injection.engine.planning.planner:fit_messages",
    "injection.engine.planning.planner:layout",
    "injection.engine.turns:TurnGenerator.plan",
    "injection.engine.turns:TurnGenerator.run",
    "injection.engine.turns:TurnGenerator.keep",
    "injection.kvcache.chain:SegmentChain.get",
    "injection.kvcache.kvsource:PreferenceKVSource.lookup",
    "injection.kvcache.kvsource:PreferenceKVSource.store",
    "injection.kvcache.conversation:ConversationStore.lookup",
    "injection.engine.batch:BatchEngine._prefill",
    "injection.engine.batch:BatchEngine._admit",
    "injection.engine.batch:BatchEngine._advance",
    "injection.engine.prefill.forwards:EngineForwards._run_forwards",
    "injection.engine.faults:EngineFaults._capture_segment",
    "injection.engine.guidance.contrast:prefill",
    "gpu_worker.channels.streams:Publisher._add",
    "injection.engine.steps:prefill",
    "injection.engine.steps:row_cache",
    "injection.engine.batchcache:BatchCache.add",
    "injection.engine.turns:TurnGenerator._open",
    "injection.kvcache.l2.writes:L2Writes._write",
    "injection.kvcache.conversation:ConversationStore.keep",
    "injection.engine.planning.planner:fit_history",
    "injection.model.adapter:ModelAdapter.prompt_tokens",
    "injection.prompting.template:ChatRenderer.encode",
    "injection.prompting.template:ChatRenderer.plain",
    "injection.prompting.template:ChatRenderer.split",
]


class Sink:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, fn: str, t0: float, t1: float) -> None:
        line = json.dumps({"fn": fn, "t0": t0, "t1": t1, "th": threading.current_thread().name})
        with self.lock:
            self.f.write(line + "\n")


def _wrap(sink: Sink, name: str, fn):
    @functools.wraps(fn)
    def traced(*a, **k):
        t0 = time.time()
        try:
            return fn(*a, **k)
        finally:
            sink.write(name, t0, time.time())
    return traced


def install(sink: Sink, names: list[str]) -> None:
    for spec in names:
        mod_name, attr = spec.split(":")
        obj = importlib.import_module(mod_name)
        *owners, last = attr.split(".")
        for o in owners:
            obj = getattr(obj, o)
        fn = obj.__dict__[last] if isinstance(obj, type) else getattr(obj, last)
        if isinstance(fn, staticmethod):
            continue
        setattr(obj, last, _wrap(sink, f"{mod_name.rsplit('.', 1)[-1]}:{attr}", fn))


def main() -> None:
    out, kind, *args = sys.argv[1:]
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import django

    if kind != "celery":  # the web's database settings, as config/asgi.py sets them
        os.environ["DB_CONN_MAX_AGE"] = "0"
        os.environ.setdefault("DB_POOL", "1")
    django.setup()
    sink = Sink(out)
    more = [s for s in os.environ.get("KVI_TRACE_MORE", "").split(",") if s]
    # the web and the worker import each other's modules lazily: import what is traced now
    install(sink, TRACED + more)
    if kind == "celery":
        from celery.__main__ import main as celery_main

        sys.argv = ["celery", *args]
        celery_main()
    else:
        import uvicorn.main

        sys.argv = ["uvicorn", *args]
        uvicorn.main.main()


if __name__ == "__main__":
    main()
