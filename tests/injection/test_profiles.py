"""Model profiles: each mechanism's default for a model with its evidence, as data matched by
the model's key; no profile, no guidance (and the worker says so once)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from injection.engine.guidance.contrast import resolve
from injection.model import profiles
from injection.model.fingerprint import model_key
from injection.prompting import reminder

SMOL_KEY, QWEN_KEY = "b7753234439613b9", "0d6138893848616c"


def test_shipped_profiles_hold_a_default_and_its_evidence_per_mechanism():
    shipped = profiles.packaged()
    smol, qwen = shipped[SMOL_KEY], shipped[QWEN_KEY]
    assert (smol.name, smol.guidance, smol.calibrated) == ("smollm2-135m-instruct", 1.0, True)
    assert (qwen.name, qwen.guidance, qwen.calibrated) == ("qwen2.5-coder-0.5b", 1.0, True)
    for p in (smol, qwen):
        assert set(p.mechanisms) == {"guidance", "lean", "anchor", "reminder", "constraints",
                                     "loop_guard"}
        assert all("default" in m and "status" in m and "evidence" in m
                   for m in p.mechanisms.values())
    assert "p=8e-7" in smol.mechanisms["guidance"]["evidence"]["validation"]
    # calibrated on tuning (bench_quality --calibrate): the anchor earned the strength
    assert qwen.mechanisms["guidance"]["evidence"]["pooled"]["wins"] == 13
    # first turns: off at calibration (7/1), on since 2026-12-07 (more tuning languages, the
    # loop guard on guided rows: +21/-0, confirmed on validation)
    assert qwen.mechanisms["guidance"]["first_turns"] is True
    # the loop guard: measured on both (on, run length 4); without a profile: off
    for key in (SMOL_KEY, QWEN_KEY):
        adapter = SimpleNamespace(_model_key=key)
        assert profiles.default_on(adapter, "loop_guard") and profiles.loop_ngram(adapter) == 4
    assert not profiles.default_on(SimpleNamespace(_model_key="0" * 16), "loop_guard")


def test_guidance_default_follows_the_profile_and_is_off_without_one():
    smol, qwen = (SimpleNamespace(_model_key=k) for k in (SMOL_KEY, QWEN_KEY))
    other = SimpleNamespace(_model_key="0123456789abcdef")
    french = ["Always answer in French."]
    assert resolve(smol, None, french) == 1.0
    assert resolve(qwen, None, french) == 1.0
    assert resolve(other, None, french) == 0.0
    assert resolve(qwen, 0.5, french) == 0.5  # a request's (or tenant's) strength still holds
    assert profiles.summary(other) == {"name": "none", "model_key": "0123456789abcdef",
                                       "calibrated": False, "guidance": 0.0,
                                       "reminder": True, "constraints": True, "loop_guard": False,
                                       "defaults": {}}
    assert profiles.summary(smol)["defaults"]["guidance"] == 1.0


def write(path, key: str, strength, **switches) -> None:
    """A profile of guidance ``strength``; ``switches``: e.g. reminder="off"."""
    path.write_text(json.dumps({"model": "mine", "model_key": key, "mechanisms": {
        "guidance": {"default": strength, "status": "measured", "evidence": "x"},
        **{k: {"default": v, "status": "measured", "evidence": "x"}
           for k, v in switches.items()}}}))


def test_the_reminder_and_constraints_defaults_are_the_profiles_else_the_platforms(
        tmp_path, monkeypatch):
    smol, qwen, other = (SimpleNamespace(_model_key=k)
                         for k in (SMOL_KEY, QWEN_KEY, "0123456789abcdef"))
    for adapter in (smol, qwen, other):  # both shipped profiles keep them on; none: platform
        assert profiles.default_on(adapter, "reminder") and profiles.default_on(
            adapter, "constraints")
    write(tmp_path / "off.json", "k" * 16, 1.0, reminder="off", constraints=False)
    measured_off = SimpleNamespace(_model_key="k" * 16,
                                   _profile=profiles.read(tmp_path / "off.json"))
    assert not profiles.default_on(measured_off, "reminder")
    assert not profiles.default_on(measured_off, "constraints")
    summary = profiles.summary(measured_off)
    assert (summary["reminder"], summary["constraints"]) == (False, False)
    assert summary["defaults"]["reminder"] == "off"
    # "platform default: ..." (Qwen's reminder, SmolLM2's both) is the platform's, read when
    # asked
    qwen_reminder = profiles.packaged()[QWEN_KEY].mechanisms["reminder"]["default"]
    assert qwen_reminder.startswith(profiles.PLATFORM)
    monkeypatch.setattr(reminder, "DEFAULT_ON", False)
    assert not profiles.default_on(qwen, "reminder") and not profiles.default_on(
        other, "reminder")
    assert profiles.default_on(qwen, "constraints")  # measured on Qwen: "on"


def test_a_profile_beside_the_model_wins_only_for_its_own_key(tmp_path, caplog):
    write(tmp_path / profiles.PROFILE_FILE, SMOL_KEY, 0.5)
    assert profiles.find(SMOL_KEY, tmp_path).guidance == 0.5  # the operator's own
    assert profiles.find(QWEN_KEY, None).name == "qwen2.5-coder-0.5b"
    with caplog.at_level(logging.WARNING, logger="injection.model.profiles"):
        assert profiles.find(QWEN_KEY, tmp_path).name == "qwen2.5-coder-0.5b"
    assert "not the loaded model's" in caplog.text


@pytest.mark.parametrize("body", ["{", json.dumps({"model_key": "k"}),
                                  json.dumps({"model_key": "k", "mechanisms": {
                                      "guidance": {"default": -1}}}),
                                  json.dumps({"model_key": "k", "mechanisms": {
                                      "guidance": {"default": 1},
                                      "reminder": {"default": "maybe"}}})])
def test_a_bad_profile_is_a_clear_error(tmp_path, body):
    bad = tmp_path / "p.json"
    bad.write_text(body)
    with pytest.raises(profiles.ProfileError, match="p.json"):
        profiles.read(bad)


def test_attach_keeps_the_profile_on_the_adapter_and_says_when_there_is_none(
        demo_model_path, caplog):
    from injection.model.loading import load_adapter

    adapter = load_adapter(demo_model_path, device="cpu", cpu_threads="shared")
    with caplog.at_level(logging.INFO, logger="injection.model.profiles"):
        assert profiles.attach(adapter, demo_model_path) is None
    assert f"no model profile for model key {model_key(adapter)}" in caplog.text
    assert profiles.guidance_default(adapter) == 0.0
    write(demo_model_path / profiles.PROFILE_FILE, model_key(adapter), 2.0)
    try:
        assert profiles.attach(adapter, demo_model_path).guidance == 2.0
        assert resolve(adapter, None, ["Reply in German."]) == 2.0
    finally:
        (demo_model_path / profiles.PROFILE_FILE).unlink()
        adapter._profile = None


DEEP = [m for k in range(3) for m in ({"role": "user", "content": f"Question {k}?"},
                                      {"role": "assistant", "content": f"Answer {k}."})]


def test_a_profile_that_measured_the_reminder_and_constraints_off_turns_them_off(
        adapter, tmp_path, monkeypatch):
    """Through the executor on the demo model: a deep turn of a member with a standing
    instruction, under a profile saying "off" for both, is the turn with both asked off;
    a request (or tenant) that asks for them still gets them."""
    from injection import build_executor
    from injection.base import ExecutionRequest
    from injection.metrics import Metrics

    lower = "Never use capital letters or commas when you reply."
    msgs = [*DEEP, {"role": "user", "content": "What should I cook tonight?"}]

    def run(**kw):
        ex = build_executor(adapter, batch_max=4, metrics=Metrics())
        try:
            res = ex.execute(ExecutionRequest("t", "u", msgs, lower, max_new_tokens=12,
                                              contrast=0.0, reuse_conversation=False, **kw))
        finally:
            ex.close()
        return res.text, res.prompt_tokens, res.constraints

    defaults, both_off, both_on = run(), run(reminder=False, constrain=False), run(
        reminder=True, constrain=True)
    assert defaults == both_on != both_off  # no profile: the platform's, on
    assert defaults[1] > both_off[1] and defaults[2] == ["lowercase", "no_comma"]
    write(tmp_path / "p.json", model_key(adapter), 0.0, reminder="off", constraints="off")
    monkeypatch.setattr(adapter, "_profile", profiles.read(tmp_path / "p.json"), raising=False)
    assert run() == both_off
    assert run(reminder=True, constrain=True) == both_on
    write(tmp_path / "p.json", model_key(adapter), 0.0, reminder="off", constraints="on")
    monkeypatch.setattr(adapter, "_profile", profiles.read(tmp_path / "p.json"), raising=False)
    assert run() == run(reminder=False) != both_off  # each switch on its own


def test_a_profile_with_the_reminder_off_leaves_deep_turns_unanchored(demo_model_path):
    """The anchor runs on reminded turns only (``guidance/plan.plan_anchor``): a profile
    saying the reminder off takes it along (measured on Qwen's validation: the platform
    +12/0 over ``- reminder``, the reminder alone +1/0). Planned from the tokenizer alone."""
    from transformers import AutoTokenizer

    from injection.base import ExecutionRequest
    from tests.injection.test_planner import TextOnly, planner

    text = TextOnly(AutoTokenizer.from_pretrained(str(demo_model_path)))
    turns = planner(text, batching=True)
    req = ExecutionRequest("t", "u", [*DEEP, {"role": "user", "content": "And now?"}],
                           "Always answer in French.")
    plans = {}
    for reminder_default in ("on", "off"):
        text._profile = profiles.Profile("mine", "", 1.0, True, "test", {
            "guidance": {"default": 1.0, "first_turns": False},
            "reminder": {"default": reminder_default}})
        plans[reminder_default] = turns.plan(req)
    assert plans["on"].reminder.text and plans["on"].anchor is not None
    off = plans["off"]
    assert not off.reminder.text and off.anchor is None and off.guide is None


def test_a_profile_can_anchor_a_first_turn_it_leaves_unguided(demo_model_path):
    """``anchor.first_turns``: a first turn whose guidance the profile leaves off gets an
    anchor instead (its first token as the guide would pick it, then no guide and no lean);
    absent, or with guidance on, as before. Planned from the tokenizer alone."""
    from transformers import AutoTokenizer

    from injection.base import ExecutionRequest
    from tests.injection.test_planner import TextOnly, planner

    text = TextOnly(AutoTokenizer.from_pretrained(str(demo_model_path)))
    turns = planner(text, batching=True)
    req = ExecutionRequest("t", "u", [{"role": "user", "content": "How do bees make honey?"}],
                           "Always answer in French.")
    plans = {}
    for name, guidance, anchor in (("unguided", False, {}), ("anchored", False, {
            "first_turns": True}), ("guided", True, {"first_turns": True})):
        text._profile = profiles.Profile("mine", "", 1.0, True, "test", {
            "guidance": {"default": 1.0, "first_turns": guidance}, "anchor": anchor})
        plans[name] = turns.plan(req)
    assert plans["unguided"].anchor is None and plans["unguided"].guide is None
    assert plans["unguided"].lean is None
    anchored = plans["anchored"]
    assert anchored.anchor is not None and anchored.guide is None and anchored.lean is None
    assert anchored.anchor.guide.ids and anchored.anchor.ids  # the turn against its guide
    assert plans["guided"].anchor is None  # guided (its lean or guide row): no anchor
    assert plans["guided"].lean is not None or plans["guided"].guide is not None
    text._profile = profiles.Profile("mine", "", 1.0, True, "test", {
        "guidance": {"default": 1.0, "first_turns": False}, "anchor": {"first_turns": True}})
    plain = ExecutionRequest("t", "u", req.messages, "I have a cat named Tom.")
    assert turns.plan(plain).anchor is None  # nothing guidance would serve: nothing anchored
