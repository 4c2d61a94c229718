"""A copy of a model directory with random weights of the same shapes, for timing.

A GPU machine that cannot reach the weights (no hub, a 64 MiB transfer) still times the
engine faithfully: a forward's cost depends on the shapes, not on the values. Copies the
config, tokenizer and chat template; the replies are noise, so only speed is measured.

    python bench/random_weights.py SRC_DIR OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".gguf")):
            shutil.copy2(f, out / f.name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    model.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M random parameters")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
