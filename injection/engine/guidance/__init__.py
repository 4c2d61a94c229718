"""Contrastive guidance: the engine half (``contrast``) and the planner half (``plan``)."""
