"""bench/bench_vs_peer.py's pure parts: the reply comparison, the stream's rates and
percentiles, the plan's members. No server: the benchmark itself runs by ``make bench``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import vs_peer_workloads as wl  # noqa: E402
from v1stream import decode_rate, first_difference, percentile  # noqa: E402
from vs_peer_report import diff_replies  # noqa: E402


def test_first_difference_names_the_first_differing_position():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([7], [8]) == 0
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one reply ended early
    assert first_difference([], []) is None


def test_diff_replies_counts_equal_replies_and_shows_where_others_part():
    words = str.split  # a word is a token here
    got = diff_replies(["a b c", "x y z", "p q"], ["a b c", "x w z", "p q r"], words)
    assert (got["equal"], got["of"]) == (1, 3)
    assert [(m["member"], m["position"]) for m in got["mismatches"]] == [(1, 1), (2, 2)]
    assert got["mismatches"][0]["ours"] == "x y z" and got["mismatches"][0]["theirs"] == "x w z"


def test_decode_rate_is_tokens_after_the_first_over_the_time_after_it():
    assert decode_rate(11, 1.0, 3.0) == 5.0
    assert decode_rate(1, 1.0, 3.0) == 0.0  # one token: no decode to time
    assert decode_rate(5, 2.0, 2.0) == 0.0


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) == 0.0


def test_plan_gives_both_sides_the_same_distinct_members_and_new_questions():
    plan = wl.Plan.make(False, None, None, None)
    instructions, tenant = plan.groups["tenant"]
    assert 3800 <= len(instructions) <= 4000  # issue 59: ~3,900 characters
    assert len(tenant) == 200 + plan.reps and len(set(tenant)) == len(tenant)
    _, simple = plan.groups["simple"]
    assert len(simple) == max(plan.bursts) + plan.reps and len(set(simple)) == len(simple)
    quick = wl.Plan.make(True, None, None, None)
    assert quick.tenant_members < 10 and quick.soak_seconds < plan.soak_seconds
    assert len({wl.question(k) for k in range(50)}) == 50


def test_a_missing_peer_is_one_line_naming_how_to_install_it(tmp_path, monkeypatch):
    import peers

    monkeypatch.setattr(peers, "PEERS_DIR", tmp_path)
    assert "make peer-vllm" in peers.missing("vllm")
    assert "skipped" in peers.missing("llamacpp")
