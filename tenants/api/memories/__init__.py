"""``/api/memories``: a member's own memories (issue 22)."""
