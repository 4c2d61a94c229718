"""A small Llama-architecture demo model built locally (nothing comes from a model hub).

Random weights with a fixed seed plus a byte-level BPE tokenizer trained on
``injection/model/data/corpus.txt``; both saved with ``save_pretrained`` so the
platform loads them with the same ``from_pretrained`` code a real model uses.

CLI: ``python -m injection.model.demo_model OUT_DIR [--force]``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
from pathlib import Path

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "corpus.txt"
MARKER = ".demo_model.json"
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
TOOL_TOKENS = ["<|tool_call|>"]  # so the output filter's GLM format is representable

# system/user/assistant turns; BOS is added by the tokenizer, not by the template
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def build_demo_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_layers: int = 4,
    hidden_size: int = 256,
    num_heads: int = 8,
    num_kv_heads: int = 2,
    vocab_size: int = 4096,
    force: bool = False,
) -> Path:
    """Build (or reuse) the demo model + tokenizer in ``out_dir``; returns the path.

    Idempotent: an existing build with the same parameters is kept unless
    ``force``. A lock file serialises concurrent builders of the same dir.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    params = {
        "seed": seed, "num_layers": num_layers, "hidden_size": hidden_size,
        "num_heads": num_heads, "num_kv_heads": num_kv_heads, "vocab_size": vocab_size,
    }
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _built_with(out) == params:
            return out
        (out / MARKER).unlink(missing_ok=True)
        tokenizer = _train_tokenizer(vocab_size)
        tokenizer.save_pretrained(out)
        model = _random_model(tokenizer, params)
        model.save_pretrained(out)
        (out / MARKER).write_text(json.dumps(params, sort_keys=True))
    return out


def _built_with(out: Path) -> dict | None:
    marker = out / MARKER
    if not marker.exists() or not (out / "config.json").exists():
        return None
    try:
        return json.loads(marker.read_text())
    except ValueError:
        return None


def _corpus_lines() -> list[str]:
    return [ln.strip() for ln in CORPUS_PATH.read_text(encoding="utf-8").splitlines() if ln.strip()]


def _train_tokenizer(vocab_size: int):
    """Byte-level BPE trained on the shipped corpus, wrapped as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, BOS, EOS, *ROLE_TOKENS, *TOOL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS + TOOL_TOKENS,
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _random_model(tokenizer, params: dict):
    """LlamaForCausalLM with grouped-query attention and seeded random weights."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    hidden = params["hidden_size"]
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # the BPE target may not be reached on a small corpus
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=params["num_layers"],
        num_attention_heads=params["num_heads"],
        num_key_value_heads=params["num_kv_heads"],
        max_position_embeddings=2048,
        initializer_range=0.05,  # peakier logits than 0.02: greedy ties stay unlikely
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(params["seed"])
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the local demo model.")
    parser.add_argument("out_dir")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    print(build_demo_model(args.out_dir, force=args.force))


if __name__ == "__main__":
    main()
