"""The calibration's decision (bench/quality_calibrate.py): judged replies -> a model profile
the platform reads. No model: synthetic verdicts of each mechanism on and off."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from quality_calibrate import Reply, decide, profile, verdict  # noqa: E402

from injection.model import profiles  # noqa: E402


def _replies(depth: int, cond: str, verdicts: str, family: str = "standing", *,
             start: int = 0, fluent: str = "", prompt: int = 100) -> list[Reply]:
    """One reply per character of ``verdicts`` ("1" passes), cases numbered from ``start``;
    ``fluent``: "0" where a reply is not fluent (default: all fluent)."""
    flu = fluent or "1" * len(verdicts)
    return [Reply(k, family, depth, cond, v == "1", f == "1", prompt, 0)
            for k, (v, f) in enumerate(zip(verdicts, flu, strict=True), start)]


def test_a_mechanism_is_on_only_with_a_significant_gain():
    rows = (_replies(0, "platform", "0" * 8 + "1" * 4)
            + _replies(0, "+ default guidance", "1" * 12)  # 8 won / 0 lost, p=0.0078
            + _replies(0, "- constraints", "0" * 8 + "1" * 4)  # changes nothing
            + _replies(8, "platform", "1" * 10 + "00")
            + _replies(8, "+ default guidance", "1" * 11 + "0")  # 1 won: no gain shown
            + _replies(8, "- reminder", "0" * 12, prompt=80))  # 10 won / 0 lost
    decided = decide(rows)
    assert decided["guidance first turns"]["on"]
    assert not decided["anchor"]["on"] and "no gain" in decided["anchor"]["why"]
    assert decided["reminder"]["on"]
    assert decided["reminder"]["pooled"] == {"cases": 12, "with": 10, "without": 0,
                                             "wins": 10, "losses": 0, "p": 0.002}
    assert decided["reminder"]["cost_per_reply"]["prompt_tokens"] == 20.0
    assert not decided["constraints"]["on"]


def test_a_significant_loss_in_one_cell_or_lost_fluency_keeps_it_off():
    rows = (_replies(0, "platform", "1" * 12) + _replies(0, "- constraints", "0" * 12)
            + _replies(0, "platform", "0" * 8, "preference", start=100)
            + _replies(0, "- constraints", "1" * 8, "preference", start=100))
    ev = decide(rows)["constraints"]
    assert ev["pooled"]["wins"] > ev["pooled"]["losses"]
    assert not ev["on"] and "loses preference at depth 0" in ev["why"]
    looping = (_replies(0, "platform", "1" * 6 + "0" * 10, fluent="1" * 6 + "0" * 10)
               + _replies(0, "- constraints", "0" * 16))
    on, why = verdict(decide(looping)["constraints"])
    assert not on and "less fluent" in why


def test_the_profile_is_read_by_the_platform_with_its_evidence(tmp_path):
    rows = (_replies(0, "platform", "0" * 8 + "1" * 8)
            + _replies(0, "+ default guidance", "1" * 16)
            + _replies(0, "- constraints", "0" * 16, prompt=90)
            + _replies(8, "platform", "0" * 9 + "1" * 10)
            + _replies(8, "+ default guidance", "1" * 19)
            + _replies(8, "- reminder", "0" * 19))
    prof = profile(decide(rows), "some-model", "0123456789abcdef", {"replies": 105})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    read = profiles.read(path)
    assert read.model_key == "0123456789abcdef" and read.calibrated
    assert read.guidance == 1.0 and read.mechanisms["guidance"]["first_turns"]
    assert read.mechanisms["reminder"]["default"] == "on"
    ev = read.mechanisms["constraints"]["evidence"]
    assert ev["pooled"]["wins"] == 8 and ev["cost_per_reply"]["prompt_tokens"] == 10.0


def test_first_turns_alone_do_not_earn_the_default_strength():
    rows = (_replies(0, "platform", "0" * 8) + _replies(0, "+ default guidance", "1" * 8)
            + _replies(8, "platform", "0" * 8) + _replies(8, "+ default guidance", "0" * 8)
            + _replies(8, "- reminder", "0" * 8))
    prof = profile(decide(rows), "m", "k" * 16, {})
    guidance = prof["mechanisms"]["guidance"]
    assert guidance["default"] == 0.0 and not guidance["first_turns"]
    assert "not used" in guidance["first_turns_evidence"]["verdict"]
    assert prof["mechanisms"]["reminder"]["default"] == "off"


def test_an_earned_anchor_keeps_a_reminder_that_shows_no_gain_of_its_own():
    """The anchor runs on reminded turns only (Qwen's validation: switching the reminder off
    cost 12/0): a reminder off for no gain would turn the anchor off with it; a reminder
    that loses stays off whatever the anchor."""
    anchor = (_replies(8, "platform", "0" * 8 + "1" * 4)
              + _replies(8, "+ default guidance", "1" * 12))  # 8 won / 0 lost
    decided = decide(anchor + _replies(8, "- reminder", "0" * 8 + "1" * 4))  # 0 / 0
    assert decided["anchor"]["on"] and decided["reminder"]["on"]
    assert decided["reminder"]["why"].startswith("on: the anchor runs on reminded turns")
    assert "no gain shown (0 won / 0 lost" in decided["reminder"]["why"]
    losing = decide(anchor + _replies(8, "- reminder", "1" * 12))
    # with the reminder ("platform") 4/12 pass, without it 12/12: the reminder loses 8/0
    assert not losing["reminder"]["on"] and "loses" in losing["reminder"]["why"]
    unanchored = decide(_replies(8, "platform", "1" * 12) + _replies(8, "+ default guidance",
                        "1" * 12) + _replies(8, "- reminder", "1" * 12))
    assert not unanchored["anchor"]["on"] and not unanchored["reminder"]["on"]
