"""The locally built demo model loads through the ordinary from_pretrained path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from injection.model.demo_model import build_demo_model

ROOT = Path(__file__).resolve().parents[2]
TINY = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1}


def test_loads_offline_as_gqa_llama(demo_model_path):
    model = AutoModelForCausalLM.from_pretrained(demo_model_path, local_files_only=True)
    assert isinstance(model, LlamaForCausalLM)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 8, 2)
    tok = AutoTokenizer.from_pretrained(demo_model_path, local_files_only=True)
    assert cfg.vocab_size == len(tok)
    assert None not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_tokenizer_adds_bos_and_roundtrips_text(demo_model_path):
    tok = AutoTokenizer.from_pretrained(demo_model_path, local_files_only=True)
    text = "I prefer quiet restaurants and vegetarian food."
    with_special = tok(text)["input_ids"]
    plain = tok(text, add_special_tokens=False)["input_ids"]
    assert with_special == [tok.bos_token_id, *plain]
    assert tok.decode(plain) == text
    assert len(plain) < len(text) / 2  # BPE merges learned from the corpus


def test_chat_template_roles_and_generation_prompt(demo_model_path):
    tok = AutoTokenizer.from_pretrained(demo_model_path, local_files_only=True)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.index("<|system|>") < text.index("Be brief.") < text.index("<|user|>")
    assert text.endswith("<|assistant|>\n")
    assert tok.bos_token not in text  # the tokenizer adds BOS, not the template
    no_prompt = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert not no_prompt.endswith("<|assistant|>\n")


def test_idempotent_force_and_seeded(tmp_path):
    a = build_demo_model(tmp_path / "a", seed=3, **TINY)
    weights = a / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_demo_model(a, seed=3, **TINY) == a
    assert weights.stat().st_mtime_ns == mtime  # skipped: already built
    m1 = AutoModelForCausalLM.from_pretrained(a)
    build_demo_model(a, seed=3, force=True, **TINY)
    m2 = AutoModelForCausalLM.from_pretrained(a)
    b = build_demo_model(tmp_path / "b", seed=4, **TINY)
    m3 = AutoModelForCausalLM.from_pretrained(b)
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2), n  # same seed -> same weights
    assert not torch.equal(m1.lm_head.weight, m3.lm_head.weight)  # other seed differs


def test_changed_parameters_rebuild(tmp_path):
    path = build_demo_model(tmp_path, **TINY)
    build_demo_model(path, **{**TINY, "num_layers": 2})
    assert AutoModelForCausalLM.from_pretrained(path).config.num_hidden_layers == 2


def test_cli_prints_path(demo_model_path):
    out = subprocess.run(
        [sys.executable, "-m", "injection.model.demo_model", str(demo_model_path)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    )
    assert out.stdout.strip() == str(demo_model_path)
