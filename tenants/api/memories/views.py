"""``/api/memories`` and ``/api/memories/<id>``: the caller's own memories only.

Another member's or tenant's id is the same 404 as an unknown one. Writes go through
``tenants.actions.memories`` (audited, the member's cached segment invalidated)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from tenants import actions
from tenants.actions.memories import max_per_member
from tenants.api.memories.serializers import (
    MemoryListSerializer,
    MemoryOrderSerializer,
    MemoryPatchSerializer,
    MemorySerializer,
    MemoryWriteSerializer,
)
from tenants.api.permissions import request_member
from tenants.api.serializers import PK_MAX
from tenants.api.views import _BODY, MemberView, _errors
from tenants.errors import NotFound
from tenants.models import Memory


def _listing(member) -> dict:
    memories = list(actions.member_memories(member))
    return {"count": len(memories), "limit": max_per_member(),
            "results": MemorySerializer(memories, many=True).data}


class MemoryListView(MemberView):
    @extend_schema(operation_id="memories_list",
                   responses={200: MemoryListSerializer, **_errors()},
                   summary="Your memories, in order")
    def get(self, request):
        return Response(_listing(request_member(request)))

    @extend_schema(request=MemoryWriteSerializer,
                   responses={201: MemorySerializer, **_errors(*_BODY)},
                   summary="Add a memory (at the end of your list)")
    def post(self, request):
        member = request_member(request)
        body = MemoryWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        memory = actions.do_create_memory(member, actor=request.user,
                                          source=Memory.Source.MEMBER, **body.validated_data)
        return Response(MemorySerializer(memory).data, status=201)


class MemoryOrderView(MemberView):
    @extend_schema(request=MemoryOrderSerializer,
                   responses={200: MemoryListSerializer, **_errors(*_BODY, 409)},
                   summary="Reorder your memories (the first is your preference); 409 unless "
                           "`order` lists each of your current memory ids once")
    def put(self, request):
        member = request_member(request)
        body = MemoryOrderSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        actions.do_reorder_memories(member, body.validated_data["order"], actor=request.user)
        return Response(_listing(member))


def _own(member, pk: int) -> Memory:
    if pk > PK_MAX:
        raise NotFound("Unknown memory.")
    return actions.get_memory(member, pk)


class MemoryDetailView(MemberView):
    @extend_schema(responses={200: MemorySerializer, **_errors(404)},
                   summary="One of your memories")
    def get(self, request, pk: int):
        return Response(MemorySerializer(_own(request_member(request), pk)).data)

    @extend_schema(request=MemoryPatchSerializer,
                   responses={200: MemorySerializer, **_errors(*_BODY, 404)},
                   summary="Change some fields of one of your memories, or switch its rules "
                           "off or on")
    def patch(self, request, pk: int):
        member = request_member(request)
        _own(member, pk)  # 404 before validating the body
        body = MemoryPatchSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        memory = actions.do_change_memory(member, pk, actor=request.user, **body.validated_data)
        return Response(MemorySerializer(memory).data)

    @extend_schema(responses={204: None, **_errors(404)}, summary="Delete one of your memories")
    def delete(self, request, pk: int):
        member = request_member(request)
        _own(member, pk)
        actions.do_delete_memory(member, pk, actor=request.user)
        return Response(status=204)
