"""Generation: the executor (cache chain -> injected generation) and the continuous batching
engine (batch cache, rows, sampling, stopping).
"""
