"""Loading a local model directory into a :class:`ModelAdapter` (offline)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from injection.errors import ModelLoadError
from injection.model import cpu_threads as threads
from injection.model.adapter import ModelAdapter
from injection.model.cpu_matmul import setup as cpu_matmul_setup
from injection.model.dtypes import resolve_dtype
from injection.model.fused import fuse
from injection.model.lean_step import lean_step as make_lean_step

__all__ = ["load_adapter"]


def load_adapter(
    model_path: str | Path, *, device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None, cpu_matmul: str = "auto",
    cpu_threads: str = "engine", lean_step: bool = True,
) -> ModelAdapter:
    """Load a local HF model dir (offline) into a :class:`ModelAdapter`; on a CPU its
    decode-shaped products take the faster kernel measured (``cpu_matmul``), and it is
    loaded on a thread of its own whose OpenMP team ends with it (``cpu_threads``
    "engine": see ``model/cpu_threads.py``; "shared": on the caller's thread). With
    ``lean_step`` its forwards skip transformers' plumbing where the model's layout allows
    (``model/lean_step.py``: the same logits and K/V bit for bit)."""
    if cpu_threads not in threads.MODES:
        raise ValueError(f"cpu threads mode must be one of {threads.MODES}, not {cpu_threads!r}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def load() -> ModelAdapter:
        adapter = _load(model_path, dev, dtype, cpu_matmul)
        adapter.cpu_threads = cpu_threads
        if lean_step:  # the lean step's stacked projections (``fused.py``)
            adapter.fused = fuse(adapter.model, adapter.matmul)
        adapter.lean = make_lean_step(adapter.model) if lean_step else None
        return adapter

    alone = dev.type == "cpu" and cpu_threads == "engine"
    return threads.run_alone(load) if alone else load()


def _load(model_path: str | Path, dev: torch.device, dtype: str | torch.dtype | None,
          cpu_matmul: str) -> ModelAdapter:
    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
        torch_dtype = resolve_dtype(dtype, device=dev, config=config)
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype,
                                                     local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model from {model_path!r}: {exc}") from exc
    adapter = ModelAdapter(model.to(dev), tokenizer, device=dev, dtype=torch_dtype)
    adapter.matmul = cpu_matmul_setup(adapter.model, dev, cpu_matmul)
    return adapter
