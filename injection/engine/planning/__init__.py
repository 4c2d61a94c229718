"""A turn as a plan: what it injects, renders and reuses, decided before any K/V is fetched
(``plan.py``: the values, ``planner.py``: how they are decided, ``results.py``: the reply's
figures once the plan has run)."""
