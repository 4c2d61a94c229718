"""Token budgets: periods, the admission ledger (reserve, settle, release), prompt
estimates and tokens-per-minute counters. State changes go through
``tenants.actions.budgets``; this package holds the mechanics."""
