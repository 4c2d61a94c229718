"""A member's memories in the engine: the cached segment's budget, recall, embeddings."""

from injection.memory.embed import HiddenStateEmbedder
from injection.memory.plan import MemoryPlan, render, split_budget
from injection.memory.recall import MemoryPlanner, RecallOptions

__all__ = ["HiddenStateEmbedder", "MemoryPlan", "MemoryPlanner", "RecallOptions", "render",
           "split_budget"]
