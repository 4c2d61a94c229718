"""DRF views. Thin: validate, resolve the member, hand off to actions/workers, shape the answer.

Every query is scoped to the caller's tenant *and* member; unknown and foreign ids are
both 404. Errors are raised as the ``tenants.errors`` family (one exception handler).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.db.models import Count
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import actions
from tenants.api.context_limits import check_fits, completion_cap
from tenants.api.pagination import PARAMETERS, StrictLimitOffsetPagination
from tenants.api.permissions import request_member
from tenants.api.serializers import (
    PK_MAX,
    ChatRequestSerializer,
    ChatResponseSerializer,
    ConversationDetailSerializer,
    ConversationPageSerializer,
    ConversationSerializer,
    ErrorSerializer,
    InstructionsSerializer,
    InstructionsWriteSerializer,
    MeSerializer,
    PreferenceSerializer,
    PreferenceWriteSerializer,
)
from tenants.api.throttling import ApiThrottle, ChatThrottle
from tenants.errors import Forbidden, InvalidInput, NotFound
from tenants.models import Conversation, Preference
from tenants.ports import run_chat

_STATUS = {
    400: "Malformed JSON or invalid input (`fields` says which).",
    401: "No or invalid credentials.",
    403: "Inactive member, user or tenant; or not allowed.",
    404: "Unknown id, or an id of someone else.",
    409: "A concurrent request changed the same object first, a stale expected_version, or "
         "a chat with this Idempotency-Key still running (`Retry-After`).",
    413: "The request body is too large.",
    415: "The body is not application/json.",
    422: "Well-formed but unprocessable (an Idempotency-Key reused for another body; a "
         "period that cannot be reported).",
    429: "Rate limit, tokens-per-minute limit (`throttled`) or token budget "
         "(`budget_exceeded`) hit (`Retry-After`).",
    502: "The worker failed to generate.",
    503: "A worker, the task queue or a backing service is unavailable (`Retry-After`).",
}
_BODY = (400, 413, 415)  # every endpoint that reads a JSON body


def _errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """Error answers of an endpoint: its own plus those of every authenticated endpoint."""
    return {s: OpenApiResponse(ErrorSerializer, description=_STATUS[s])
            for s in sorted({401, 403, 429, 503, *statuses})}


class MemberView(APIView):
    """Base: authenticated active member of an active tenant, throttled per member/tenant."""

    throttle_classes = [ApiThrottle]


IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces
IDEMPOTENCY_PARAM = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 128, "pattern": r"^[\x21-\x7e]{1,128}$"},
    OpenApiParameter.HEADER,
    description="Up to 128 printable ASCII characters, unique per request of yours. A retry "
    "with the same key returns the stored answer instead of generating again (409 while the "
    "first request still runs). Default: the request id (named in a 503 answer).",
)


def idempotency_key(request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidInput("Idempotency-Key must be 1-128 printable ASCII characters.")
    return key


class ChatView(MemberView):
    throttle_classes = [ChatThrottle]

    @extend_schema(
        request=ChatRequestSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={200: ChatResponseSerializer, **_errors(*_BODY, 404, 409, 422, 502)},
        summary="Send a message; the reply is generated with your preference injected",
    )
    def post(self, request):
        member = request_member(request)
        body = ChatRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        conversation_id = data.get("conversation")
        if conversation_id is not None:
            actions.get_conversation(member, conversation_id)  # 404 unless the caller's own
        params = {
            # the tenant's own cap shortens a longer ask (the reply ends "length")
            "max_new_tokens": min(data.get("max_new_tokens", settings.CHAT_DEFAULT_MAX_NEW_TOKENS),
                                  completion_cap(member.tenant)),
            "temperature": data.get("temperature", 0.0),
            "top_p": data.get("top_p", 1.0),
            "alpha": data.get("alpha"),
            # only when sent: the idempotency hash of requests without it stays as it was
            **({"contrast": data["contrast"]} if data.get("contrast") is not None else {}),
            **{k: data[k] for k in ("reminder", "constraints", "loop_guard") if k in data},
        }
        check_fits(chat_model_path(), [data["message"], *_context_texts(member)],
                   params["max_new_tokens"])
        # "remember that ..." / "forget ...": applied before dispatch (tenant opt-in)
        memory_write = actions.do_memory_from_chat(member, data["message"], actor=request.user)
        outcome = run_chat(member, conversation_id, data["message"], params,
                           idempotency_key(request), request.kvi_request_id)
        headers = {"Idempotent-Replayed": "true"} if outcome.replayed else None
        body = outcome.body if memory_write is None else {**outcome.body,
                                                          "memory_write": memory_write}
        return Response(body, headers=headers)


def chat_model_path() -> str:
    """The workers' model dir as configured (the web reads its tokenizer and config only)."""
    if settings.MODEL_PATH:
        return str(settings.MODEL_PATH)
    demo = settings.DEFAULT_MODEL == "demo"
    return str(settings.DEMO_MODEL_PATH if demo else settings.DEFAULT_MODEL_PATH)


def _context_texts(member) -> list[str]:
    """What the worker puts in the system turn: tenant instructions and the preference."""
    pref = member.own_preference()
    texts = [member.tenant.instructions]
    if pref is not None and pref.enabled:
        texts.append(pref.text)
    return texts


class ConversationListView(MemberView):
    @extend_schema(operation_id="conversations_list", parameters=PARAMETERS,
                   responses={200: ConversationPageSerializer, **_errors(400)},
                   summary="Your conversations, most recent first (one page)")
    def get(self, request):
        member = request_member(request)
        qs = (
            Conversation.objects.filter(tenant=member.tenant, member=member)
            .annotate(message_count=Count("messages"))
            .order_by("-updated_at", "-id")
        )
        paginator = StrictLimitOffsetPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(ConversationSerializer(page, many=True).data)


def _own_conversation(member, pk: int) -> Conversation:
    if pk > PK_MAX:
        raise NotFound("Unknown conversation.")
    conv = actions.get_conversation(member, pk)
    conv.message_count = conv.messages.count()
    return conv


class ConversationDetailView(MemberView):
    @extend_schema(responses={200: ConversationDetailSerializer, **_errors(404)},
                   summary="One of your conversations with its messages")
    def get(self, request, pk: int):
        conv = _own_conversation(request_member(request), pk)
        return Response(ConversationDetailSerializer(conv).data)

    @extend_schema(responses={204: None, **_errors(404)}, summary="Delete one of your conversations")
    def delete(self, request, pk: int):
        member = request_member(request)
        if pk > PK_MAX:
            raise NotFound("Unknown conversation.")
        actions.do_delete_conversation(member, pk, actor=request.user)
        return Response(status=204)


class PreferenceView(MemberView):
    def _current(self, member) -> Preference:
        pref = Preference.objects.filter(tenant=member.tenant, member=member).first()
        if pref is None:
            raise NotFound("You have no preference yet.")
        return pref

    @extend_schema(responses={200: PreferenceSerializer, **_errors(404)},
                   summary="Your preference (text, enabled, alpha, version)")
    def get(self, request):
        return Response(PreferenceSerializer(self._current(request_member(request))).data)

    @extend_schema(request=PreferenceWriteSerializer,
                   responses={200: PreferenceSerializer, **_errors(*_BODY, 409)},
                   summary="Set your preference (enabled/alpha unchanged when omitted)")
    def put(self, request):
        return self._write(request, partial=False)

    @extend_schema(request=PreferenceWriteSerializer,
                   responses={200: PreferenceSerializer, **_errors(*_BODY, 404, 409)},
                   summary="Change some fields of your preference")
    def patch(self, request):
        return self._write(request, partial=True)

    @extend_schema(responses={204: None, **_errors(404)}, summary="Delete your preference")
    def delete(self, request):
        actions.do_delete_preference(request_member(request), actor=request.user)
        return Response(status=204)

    def _write(self, request, *, partial: bool) -> Response:
        member = request_member(request)
        body = PreferenceWriteSerializer(data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        if partial:
            self._current(member)  # PATCH changes an existing preference only
        pref = actions.do_change_preference(member, actor=request.user, **body.validated_data)
        pref.refresh_from_db()
        return Response(PreferenceSerializer(pref).data)


class MeView(MemberView):
    @extend_schema(responses={200: MeSerializer, **_errors()}, summary="Who am I")
    def get(self, request):
        return Response(MeSerializer(request_member(request)).data)


class TenantInstructionsView(MemberView):
    """The tenant-wide instructions: readable and writable by the tenant's admins only."""

    def _admin(self, request):
        member = request_member(request)
        if not member.is_tenant_admin:
            raise Forbidden("Only tenant admins can read or change the tenant instructions.")
        return member

    @extend_schema(responses={200: InstructionsSerializer, **_errors()},
                   summary="Your tenant's instructions (tenant admins)")
    def get(self, request):
        return Response(InstructionsSerializer(self._admin(request).tenant).data)

    @extend_schema(request=InstructionsWriteSerializer,
                   responses={200: InstructionsSerializer, **_errors(*_BODY, 409)},
                   summary="Set your tenant's instructions (tenant admins; cached K/V recomputed)")
    def put(self, request):
        member = self._admin(request)
        body = InstructionsWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tenant = actions.do_set_tenant_instructions(
            member.tenant, body.validated_data["instructions"], actor=request.user,
            expected_version=body.validated_data.get("expected_version"),
        )
        return Response(InstructionsSerializer(tenant).data)
