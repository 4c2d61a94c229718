"""Every state change goes through a ``do_*`` function: one transaction, audit row included.

One module per concern; everything is re-exported here, so callers keep using
``from tenants import actions`` / ``from tenants.actions import do_x``.
"""

from tenants.actions.base import assert_actor_may_manage, audit
from tenants.actions.budgets import PERIODS as BUDGET_PERIODS
from tenants.actions.budgets import (
    check_budget,
    do_admit_prompt,
    do_claim_chat_within_budget,
    do_clear_budget,
    do_set_budget,
    note_usage,
)
from tenants.actions.cache import (
    do_clear_kv_cache,
    do_warm_kv_cache,
    invalidate_on_commit,
    log,
    warm_on_commit,
)
from tenants.actions.chat import (
    do_delete_conversation,
    do_record_cancelled,
    do_record_chat,
    do_record_discarded,
    do_record_failed,
    get_conversation,
)
from tenants.actions.exchanges import (
    Claim,
    claim_is_live,
    do_abandon_chat,
    do_claim_chat,
    do_prune_claims,
    is_answered,
    request_hash,
)
from tenants.actions.members import (
    UNAVAILABLE,
    User,
    do_add_member,
    do_change_member,
    do_delete_member,
    do_record_account_change,
    do_record_login,
    do_record_login_failure,
    username_unavailable,
)
from tenants.actions.memories import (
    do_create_memory,
    do_delete_memory,
    do_reorder_memories,
    do_update_memory,
    get_memory,
    member_memories,
)
from tenants.actions.memory_chat import do_memory_from_chat
from tenants.actions.memory_rules import (
    do_change_memory,
    do_change_preference,
    do_set_memory_rules_enabled,
    preference_rules,
)
from tenants.actions.playground import do_record_playground
from tenants.actions.preferences import (
    PREFERENCE_MAX_CHARS,
    do_delete_preference,
    do_set_preference,
)
from tenants.actions.tenants import (
    INSTRUCTIONS_MAX_CHARS,
    TENANT_FIELDS,
    do_create_tenant,
    do_set_tenant_active,
    do_set_tenant_instructions,
    do_update_tenant,
    get_tenant,
)
from tenants.actions.tokens import do_create_api_token, do_revoke_api_token

__all__ = [
    "BUDGET_PERIODS",
    "check_budget",
    "do_admit_prompt",
    "do_claim_chat_within_budget",
    "do_clear_budget",
    "do_set_budget",
    "note_usage",
    "do_record_playground",
    "do_create_memory",
    "do_memory_from_chat",
    "do_delete_memory",
    "do_reorder_memories",
    "do_update_memory",
    "do_change_memory",
    "do_change_preference",
    "do_set_memory_rules_enabled",
    "preference_rules",
    "get_memory",
    "member_memories",
    "INSTRUCTIONS_MAX_CHARS",
    "Claim",
    "claim_is_live",
    "do_prune_claims",
    "is_answered",
    "do_abandon_chat",
    "do_claim_chat",
    "request_hash",
    "PREFERENCE_MAX_CHARS",
    "TENANT_FIELDS",
    "User",
    "assert_actor_may_manage",
    "audit",
    "do_add_member",
    "do_change_member",
    "do_clear_kv_cache",
    "do_create_api_token",
    "do_create_tenant",
    "do_delete_conversation",
    "do_delete_member",
    "do_delete_preference",
    "do_record_account_change",
    "do_record_cancelled",
    "do_record_chat",
    "do_record_discarded",
    "do_record_failed",
    "do_record_login",
    "do_record_login_failure",
    "username_unavailable",
    "UNAVAILABLE",
    "do_revoke_api_token",
    "do_set_preference",
    "do_set_tenant_active",
    "do_set_tenant_instructions",
    "do_update_tenant",
    "do_warm_kv_cache",
    "get_conversation",
    "get_tenant",
    "invalidate_on_commit",
    "log",
    "warm_on_commit",
]
