"""``kvcache stats`` per kind in Redis (real Redis): tenant segments counted exactly from
their own index, conversation links from the tenant's link ledger, member segments the
rest."""

from __future__ import annotations

import torch

from gpu_worker.channels import kvstore
from gpu_worker.ops import cachestats
from injection.base import CacheKey
from injection.kvcache.chain import TENANT_USER
from injection.kvcache.packed import PackedKV

TID = "9001"


def kv(tokens: int) -> PackedKV:
    k = torch.zeros(1, 1, tokens, 4)
    return PackedKV(k, torch.ones_like(k), range(tokens))


def test_l2_bytes_and_entries_per_kind():
    tier = kvstore.l2_tier()
    try:
        seg, member, conv = (CacheKey(TID, TENANT_USER, "instr", "fp"),
                             CacheKey(TID, "7", "pref", "fp"), CacheKey(TID, "7", "conv", "fp"))
        for k, n in ((seg, 8), (member, 2)):
            assert tier.put(k, kv(n))
        assert tier.put(conv, kv(5), link=True)
        seg_bytes = tier.user_sizes(TID, TENANT_USER)["bytes"]
        conv_bytes = int(tier.client.strlen(tier.signer.redis_key(conv)))
        assert tier.user_sizes(TID, TENANT_USER)["entries"] == 1 and seg_bytes > 8 * 2 * 16
        sizes = tier.stats(scan=True, tenants=[TID])
        kinds = cachestats._l2_kinds({"tenant": {"entries": 1}}, tier, [TID], sizes)
        total = sizes["per_tenant"][TID]["bytes"]
        assert (kinds["tenant"]["l2_entries"], kinds["tenant"]["l2_bytes"]) == (1, seg_bytes)
        assert (kinds["conversation"]["l2_entries"], kinds["conversation"]["l2_bytes"]) == (
            1, conv_bytes)
        assert (kinds["member"]["l2_entries"], kinds["member"]["l2_bytes"]) == (
            1, total - seg_bytes - conv_bytes)
        assert kinds["tenant"]["entries"] == 1  # the workers' L1 figures are kept
    finally:
        tier.evict(TID)


def test_the_printed_footer_says_what_the_member_row_counts():
    from io import StringIO

    from gpu_worker.management.commands.kvcache import Command

    out = StringIO()
    cmd = Command(stdout=out)
    cmd._print_stats({"key_generation": 0, "live_workers": [], "workers": [], "tenants": {},
                      "kinds": {"member": {"l2_entries": 1, "l2_bytes": 10},
                                "conversation": {"l2_entries": 1, "l2_bytes": 5}}})
    footer = out.getvalue().splitlines()[-1]
    assert "leans" in footer and "conversation links are counted apart" in footer
