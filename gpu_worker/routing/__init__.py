"""Which worker serves a request: the Redis worker registry (liveness, in-flight tasks,
delivery counts), member affinity, and the per-node agent that keeps them fresh.
"""
