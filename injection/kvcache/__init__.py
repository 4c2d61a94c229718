"""K/V segments and their cache tiers: PackedKV, L1 (tenant-partitioned LRU), L2 (HMAC-signed
Redis entries, codec, signing, background writer), single-flight acquisition, conversation K/V.
"""
