"""The requests Open WebUI (0.12, default settings, native function calling) sends to an
OpenAI connection, replayed over plain HTTP against the live server and a real worker:

* the chat: ``stream: true``, ``stream_options.include_usage`` (Open WebUI forces it when
  streaming), its built-in tools in ``tools``, no ``max_tokens``;
* the title task: ``max_completion_tokens: 1000`` (``max_tokens: 1000`` for Ollama-owned
  models), ``stream: false``;
* the follow-up suggestions task: no length, ``stream: false``.

Open WebUI itself is not installed here; the shapes follow its source (routers/openai.py,
routers/tasks.py, tools/builtin.py), with the prompts paraphrased. Every one must be answered.
"""

from __future__ import annotations

import json

import pytest
import requests

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Open WebUI's built-in tools (tools/builtin.py), as it converts them to OpenAI functions.
BUILTIN = {
    "get_current_timestamp": {}, "calculate_timestamp": {"days_ago": "integer"},
    "search_web": {"query": "string"}, "fetch_url": {"url": "string"},
    "generate_image": {"prompt": "string"}, "edit_image": {"prompt": "string"},
    "search_memories": {"query": "string"}, "add_memory": {"content": "string"},
    "replace_memory_content": {"memory_id": "string", "content": "string"},
    "delete_memory": {"memory_id": "string"}, "list_memories": {},
    "search_notes": {"query": "string"}, "view_note": {"note_id": "string"},
    "write_note": {"title": "string", "content": "string"},
    "replace_note_content": {"note_id": "string", "content": "string"},
    "search_chats": {"query": "string"}, "view_chat": {"chat_id": "string"},
    "list_knowledge_bases": {}, "search_knowledge_bases": {"query": "string"},
    "search_knowledge_files": {"query": "string"}, "query_knowledge_files": {"query": "string"},
    "view_knowledge_file": {"file_id": "string"}, "view_file": {"file_id": "string"},
    "search_channels": {"query": "string"}, "search_channel_messages": {"query": "string"},
    "view_channel_message": {"message_id": "string"}, "view_channel_thread": {"id": "string"},
    "execute_code": {"code": "string"}, "notify": {"message": "string"},
    "list_memory_paths": {}, "read_memory_path": {"path": "string"},
    "update_memories": {"content": "string"}, "search_automations": {"query": "string"},
    "create_automation": {"name": "string"}, "list_skills": {}, "view_skill": {"name": "string"},
}
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"Open WebUI built-in tool {name}.",
    "parameters": {"type": "object", "required": list(args),
                   "properties": {a: {"type": t, "description": a} for a, t in args.items()}}}}
    for name, args in BUILTIN.items()]
HISTORY = "USER: What should I cook tonight?\nASSISTANT: A vegetable curry."
TITLE = ("### Task:\nWrite a short title of 3-5 words, with an emoji, for the chat below.\n"
         "### Output:\nOnly the title.\n### Chat History:\n<chat_history>\n"
         f"{HISTORY}\n</chat_history>")
FOLLOW_UP = ("### Task:\nSuggest 3-5 follow-up questions the user could ask next.\n"
             "### Output:\nJSON format: { \"follow_ups\": [\"Question 1?\"] }\n"
             f"### Chat History:\n<chat_history>\n{HISTORY}\n</chat_history>")


@pytest.fixture(params=["live_server"])
def connection(request, member_key, settings, demo_model_path):
    """Open WebUI's connection: base URL + a member's API key; it lists the models first.
    ``live_server`` is Django's WSGI server; ``asgi_server`` is uvicorn, the deployed web."""
    settings.MODEL_PATH = str(demo_model_path)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {member_key[1]}"
    base = f"{request.getfixturevalue(request.param).url}/v1"
    models = session.get(f"{base}/models", timeout=30).json()["data"]
    return session, base, models[0]["id"]


@pytest.mark.parametrize("connection", ["live_server", "asgi_server"], indirect=True)
def test_a_streamed_chat_with_the_builtin_tools_is_answered(connection, gpu_worker,
                                                            demo_model_path):
    from tenants.api.context_limits import model_limits

    session, base, model = connection
    _, max_pos = model_limits(str(demo_model_path))
    assert len(TOOLS) == 36
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What should I cook tonight?"}]
    for _turn in range(2):  # the second turn carries the first reply as history
        body = {"model": model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, "tools": TOOLS}
        r = session.post(f"{base}/chat/completions", json=body, stream=True, timeout=180)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
        assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
        events = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert "error" not in events[-1], events[-1]
        choices = [e["choices"][0] for e in events if e["choices"]]
        reply = "".join(c["delta"].get("content") or "" for c in choices)
        assert reply.strip() and not any(c["delta"].get("tool_calls") for c in choices)
        assert choices[-1]["finish_reason"] in ("stop", "length")
        usage = events[-1]["usage"]  # include_usage: the last event, with no choices
        assert events[-1]["choices"] == [] and usage["completion_tokens"] > 0
        # no max_tokens: until the model stops, the server's cap or the context is full
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= max_pos
        messages = [*messages, {"role": "assistant", "content": reply},
                    {"role": "user", "content": "And for dessert?"}]


@pytest.mark.parametrize("length", [{"max_completion_tokens": 1000}, {"max_tokens": 1000}])
def test_the_title_task_is_answered(connection, gpu_worker, length):
    session, base, model = connection
    body = {"model": model, "messages": [{"role": "user", "content": TITLE}], "stream": False,
            **length}
    r = session.post(f"{base}/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_follow_up_task_is_answered(connection, gpu_worker):
    session, base, model = connection
    body = {"model": model, "messages": [{"role": "user", "content": FOLLOW_UP}],
            "stream": False}
    r = session.post(f"{base}/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].strip()
