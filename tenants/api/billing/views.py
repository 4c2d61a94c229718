"""``GET /api/usage``: the caller's tenant's usage per member x model x UTC day (prompt
tokens computed vs from cache, completion tokens, requests, errors) and its budgets'
spend this period. Tenant admins only (members: 403); never another tenant's rows."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from tenants.api.fields import StrictDateField
from tenants.api.permissions import request_member
from tenants.api.views import MemberView, _errors
from tenants.errors import Forbidden, InvalidPeriod
from tenants.usage import billing


class UsageQuerySerializer(serializers.Serializer):
    start = StrictDateField(required=False, help_text="First UTC day (YYYY-MM-DD).")
    end = StrictDateField(required=False, help_text="Last UTC day (default: today).")
    days = serializers.IntegerField(required=False, min_value=1, max_value=billing.MAX_DAYS,
                                    help_text="Without start: the last N days (default 30).")


_ROW = inline_serializer("UsageRow", many=True, fields={
    "day": serializers.DateField(), "tenant": serializers.CharField(),
    "member": serializers.CharField(), "member_id": serializers.IntegerField(),
    "model": serializers.CharField(), **{f: serializers.IntegerField() for f in (
        "requests", "errors", "prompt_tokens", "cached_tokens", "computed_tokens",
        "completion_tokens", "total_tokens", "guide_prefill_tokens", "guide_decode_tokens")}})
_BUDGET = inline_serializer("BudgetStanding", many=True, fields={
    "tenant": serializers.CharField(), "scope": serializers.ChoiceField(["tenant", "member"]),
    "member": serializers.CharField(allow_null=True), "tokens": serializers.IntegerField(),
    "period": serializers.ChoiceField(["day", "month"]), "period_start": serializers.DateField(),
    "spent": serializers.IntegerField(), "reserved": serializers.IntegerField(),
    "remaining": serializers.IntegerField(), "percent": serializers.FloatField()})
_PAGE = inline_serializer("UsageReport", {
    "tenant": serializers.CharField(), "start": serializers.DateField(),
    "end": serializers.DateField(), "data": _ROW, "budgets": _BUDGET})


class UsageView(MemberView):
    """Billable usage of the caller's tenant: one line per member, model and UTC day."""

    @extend_schema(parameters=[UsageQuerySerializer],
                   responses={200: OpenApiResponse(_PAGE), **_errors(400, 422)},
                   summary="Your tenant's usage per member, model and day, and its budgets "
                           "(tenant admins)")
    def get(self, request):
        member = request_member(request)
        if not member.is_tenant_admin:
            raise Forbidden("Only tenant admins can read the tenant's usage.")
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        try:
            start, end = billing.window(q.get("start"), q.get("end"), q.get("days", 30))
        except ValueError as exc:
            raise InvalidPeriod(f"Bad period: {exc}.") from exc
        ids = [member.tenant_id]
        return Response({"tenant": member.tenant.slug, "start": start.isoformat(),
                         "end": end.isoformat(), "data": billing.rows(ids, start, end),
                         "budgets": billing.budgets(ids)})
