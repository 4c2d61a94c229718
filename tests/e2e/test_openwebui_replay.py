"""The requests Open WebUI 0.12.4 (default settings: native function calling) sends to an
OpenAI connection, replayed over plain HTTP against the live server and a real worker. The
shapes were captured from a real Open WebUI 0.12.4 talking to this platform through a logging
proxy (docs/CLIENTS.md), prompts shortened:

* the chat: ``{"stream": true, "model", "messages", "tools": [its 36 built-in tools]}``,
  no ``max_tokens``, no ``stream_options``;
* the title task: ``{"model", "messages", "stream": false, "max_tokens": 1000}`` (its source
  sends ``max_completion_tokens: 1000`` for non-Ollama models in some versions: both here);
* the follow-up suggestions and tags tasks: ``{"model", "messages", "stream": false}``.

Every one must be answered.
"""

from __future__ import annotations

import json

import pytest
import requests

from tenants.models import Message

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The 36 tool names Open WebUI 0.12.4 sent with a chat (in its order); each as it converts a
# built-in tool: {"type": "function", "function": {name, description, parameters}}.
BUILTIN = [
    "get_current_timestamp", "calculate_timestamp", "ask_user", "list_knowledge_bases",
    "search_knowledge_bases", "query_knowledge_bases", "grep_knowledge_files",
    "search_knowledge_files", "query_knowledge_files", "view_knowledge_file", "search_chats",
    "view_chat", "search_memories", "list_memory_paths", "read_memory_path", "list_memories",
    "update_memory", "add_memory", "replace_memory_content", "delete_memory", "search_notes",
    "view_note", "write_note", "replace_note_content", "create_skill", "create_tasks",
    "update_task", "create_automation", "update_automation", "list_automations",
    "toggle_automation", "delete_automation", "search_calendar_events",
    "create_calendar_event", "update_calendar_event", "delete_calendar_event",
]
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"Open WebUI built-in tool {name}.",
    "parameters": {"properties": {} if i % 2 else {"query": {"type": "string",
                                                             "description": "What to find."}},
                   "type": "object"}}} for i, name in enumerate(BUILTIN)]
HISTORY = "USER: What should I cook tonight?\nASSISTANT: A vegetable curry."
TITLE = ("### Task:\nWrite a short title of 3-5 words, with an emoji, for the chat below.\n"
         "### Output:\nOnly the title.\n### Chat History:\n<chat_history>\n"
         f"{HISTORY}\n</chat_history>")
TAGS = ("### Task:\nGenerate 1-3 broad tags for the chat below.\n### Output:\n"
        "JSON format: { \"tags\": [\"tag1\"] }\n"
        f"### Chat History:\n<chat_history>\n{HISTORY}\n</chat_history>")
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
        body = {"stream": True, "model": model, "messages": messages, "tools": TOOLS}
        r = session.post(f"{base}/chat/completions", json=body, stream=True, timeout=180)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
        assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
        events = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert "error" not in events[-1], events[-1]
        choices = [e["choices"][0] for e in events]
        reply = "".join(c["delta"].get("content") or "" for c in choices)
        assert reply.strip() and not any(c["delta"].get("tool_calls") for c in choices)
        assert choices[-1]["finish_reason"] in ("stop", "length")
        assert all(c["finish_reason"] is None for c in choices[:-1])
        stored = Message.objects.filter(role="assistant").latest("id")
        # no max_tokens: until the model stops, the server's cap or the context is full
        assert stored.content == reply and stored.token_count <= max_pos
        messages = [*messages, {"role": "assistant", "content": reply},
                    {"role": "user", "content": "And for dessert?"}]


@pytest.mark.parametrize("length", [{"max_tokens": 1000}, {"max_completion_tokens": 1000}])
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


@pytest.mark.parametrize("prompt", [FOLLOW_UP, TAGS], ids=["follow_up", "tags"])
def test_the_follow_up_and_tags_tasks_are_answered(connection, gpu_worker, prompt):
    session, base, model = connection
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": False}
    r = session.post(f"{base}/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].strip()
