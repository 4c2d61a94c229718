"""DRF views. Thin: validate, resolve the member, hand off to actions/workers, shape the answer.

Every query is scoped to the caller's tenant *and* member; unknown and foreign ids are
both 404. Errors are raised as the ``tenants.errors`` family (one exception handler).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db.models import Count
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from gpu_worker.client import run_chat
from tenants import actions
from tenants.errors import NotFound
from tenants.models import Conversation, Preference
from tenants.permissions import request_member
from tenants.serializers import (
    PK_MAX,
    ChatRequestSerializer,
    ChatResponseSerializer,
    ConversationDetailSerializer,
    ConversationSerializer,
    ErrorSerializer,
    MeSerializer,
    PreferenceSerializer,
    PreferenceWriteSerializer,
)
from tenants.throttling import ApiThrottle, ChatThrottle


def _errors(*statuses: int) -> dict[int, OpenApiResponse]:
    return {s: OpenApiResponse(ErrorSerializer) for s in (401, 403, 429, *statuses)}


class MemberView(APIView):
    """Base: authenticated active member of an active tenant, throttled per member/tenant."""

    throttle_classes = [ApiThrottle]


class ChatView(MemberView):
    throttle_classes = [ChatThrottle]

    @extend_schema(
        request=ChatRequestSerializer,
        responses={200: ChatResponseSerializer, **_errors(400, 404, 413, 502, 503)},
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
            "max_new_tokens": data.get("max_new_tokens", settings.CHAT_DEFAULT_MAX_NEW_TOKENS),
            "temperature": data.get("temperature", 0.0),
            "top_p": data.get("top_p", 1.0),
            "alpha": data.get("alpha"),
        }
        request_id = uuid.uuid4().hex
        result = run_chat(member.pk, conversation_id, data["message"], params, request_id)
        return Response(result)


class ConversationPagination(LimitOffsetPagination):
    default_limit = 20
    max_limit = 100


class ConversationListView(MemberView):
    @extend_schema(responses={200: ConversationSerializer(many=True), **_errors()},
                   summary="Your conversations, most recent first")
    def get(self, request):
        member = request_member(request)
        qs = (
            Conversation.objects.filter(tenant=member.tenant, member=member)
            .annotate(message_count=Count("messages"))
            .order_by("-updated_at", "-id")
        )
        paginator = ConversationPagination()
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
                   responses={200: PreferenceSerializer, **_errors(400)},
                   summary="Set your preference (enabled/alpha unchanged when omitted)")
    def put(self, request):
        return self._write(request, partial=False)

    @extend_schema(request=PreferenceWriteSerializer,
                   responses={200: PreferenceSerializer, **_errors(400)},
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
        pref = actions.do_set_preference(member, actor=request.user, **body.validated_data)
        pref.refresh_from_db()
        return Response(PreferenceSerializer(pref).data)


class MeView(MemberView):
    @extend_schema(responses={200: MeSerializer, **_errors()}, summary="Who am I")
    def get(self, request):
        return Response(MeSerializer(request_member(request)).data)
