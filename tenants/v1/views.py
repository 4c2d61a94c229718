"""The OpenAI-compatible API: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Same member, injection, worker path, idempotency, storage and audit as ``/api/chat``;
the request's ``messages`` are the conversation. Errors use OpenAI's shape
(``tenants.api.exceptions.openai_exception_handler``: the same mapping, another body).
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import actions, ports
from tenants.api.context_limits import completion_cap, completion_room
from tenants.api.exceptions import openai_exception_handler
from tenants.api.permissions import request_member
from tenants.api.throttling import ApiThrottle, ChatThrottle
from tenants.api.views import IDEMPOTENCY_PARAM, _context_texts, chat_model_path, idempotency_key
from tenants.v1 import shapes as openai_io
from tenants.v1.stream import sse_response


def _errors(*statuses: int) -> dict[int, OpenApiResponse]:
    return {s: OpenApiResponse(description="OpenAI-style error: {error: {message, type, "
                               "code, param}}") for s in (401, 403, 429, *statuses)}


class OpenAIView(APIView):
    throttle_classes = [ApiThrottle]

    def get_exception_handler(self):
        return openai_exception_handler


class ModelsView(OpenAIView):
    @extend_schema(responses={200: OpenApiResponse(description="{object: list, data: [model]}"),
                              **_errors()},
                   summary="The served model and its aliases (OpenAI-compatible)", tags=["v1"])
    def get(self, request):
        request_member(request)
        return Response(openai_io.model_list(chat_model_path()))


class ChatCompletionsView(OpenAIView):
    throttle_classes = [ChatThrottle]

    @extend_schema(
        request=openai_io.CompletionRequestSerializer, parameters=[IDEMPOTENCY_PARAM],
        examples=[OpenApiExample("chat", request_only=True, value={
            "model": "kvinject", "max_tokens": 32,
            "messages": [{"role": "user", "content": "What should I cook tonight?"}]})],
        responses={200: OpenApiResponse(description="chat.completion"),
                   **_errors(400, 404, 409, 413, 422, 502, 503)},
        summary="Chat completion with your preference injected (OpenAI-compatible)",
        description="`stream: true` answers `text/event-stream` (chat.completion.chunk "
        "events, then `data: [DONE]`); see docs/API.md.",
        tags=["v1"],
    )
    def post(self, request):
        member = request_member(request)
        body = openai_io.CompletionRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        model = openai_io.resolve_model(data["model"], chat_model_path())
        conversation_id = (data.get(openai_io.EXTENSION) or {}).get("conversation")
        if conversation_id is not None:
            actions.get_conversation(member, conversation_id)  # 404 unless the caller's own
        message = data["messages"][-1]["content"]
        requested, field = openai_io.requested_tokens(data)
        kept, history = _kept_and_history(data["messages"])
        max_new_tokens = completion_room(
            chat_model_path(), [*kept, *_context_texts(member)], requested=requested,
            param=field, cap=completion_cap(member.tenant), history=history,
            history_cap=settings.CHAT_HISTORY_TOKEN_BUDGET)
        params = openai_io.chat_params(data, max_new_tokens)
        key = idempotency_key(request)
        if data.get("stream"):
            started = ports.start_stream(member, conversation_id, message, params, key,
                                         request.kvi_request_id)
            include = bool((data.get("stream_options") or {}).get("include_usage"))
            response = sse_response(request._request, ports.stream_events(member, started),
                                    model, started.request_id, include)
            if started.replay is not None:
                response["Idempotent-Replayed"] = "true"
            return response
        outcome = ports.run_chat(member, conversation_id, message, params, key,
                                 request.kvi_request_id)
        headers = {"Idempotent-Replayed": "true"} if outcome.replayed else None
        return Response(openai_io.completion(outcome.body, model), headers=headers)


def _kept_and_history(messages: list[dict]) -> tuple[list[str], list[str]]:
    """What the worker always keeps (leading system messages, the new message) and the
    turns between, which it keeps newest first as far as the context allows."""
    head = next(i for i, m in enumerate(messages) if m["role"] != "system")
    return ([m["content"] for m in (*messages[:head], messages[-1])],
            [m["content"] for m in messages[head:-1]])
