"""DRF views. Thin: validate, resolve the member, hand off, shape the answer."""

from __future__ import annotations

import uuid

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from gpu_worker.client import run_chat
from tenants.errors import NotFound
from tenants.models import Conversation
from tenants.permissions import request_member
from tenants.serializers import ChatRequestSerializer, ChatResponseSerializer


class ChatView(APIView):
    @extend_schema(request=ChatRequestSerializer, responses=ChatResponseSerializer)
    def post(self, request):
        member = request_member(request)
        body = ChatRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        conversation_id = data.get("conversation")
        if conversation_id is not None and not Conversation.objects.filter(
            pk=conversation_id, tenant=member.tenant, member=member
        ).exists():
            raise NotFound("Unknown conversation.")
        params = {
            "max_new_tokens": data.get("max_new_tokens", settings.CHAT_DEFAULT_MAX_NEW_TOKENS),
            "temperature": data.get("temperature", 0.0),
            "top_p": data.get("top_p", 1.0),
            "alpha": data.get("alpha"),
        }
        request_id = uuid.uuid4().hex
        result = run_chat(member.pk, conversation_id, data["message"], params, request_id)
        return Response(result)
