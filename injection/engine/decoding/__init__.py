"""Decoding constraints kept by the batch engine: token maps (``bans``) and phrases."""
