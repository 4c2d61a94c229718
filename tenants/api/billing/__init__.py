"""``GET /api/usage``: billable usage and budgets of the caller's tenant (tenant admins)."""
