"""/v1 driven by the client libraries people use, unchanged: LangChain's ``ChatOpenAI`` and
LlamaIndex's ``OpenAILike`` -> live HTTP server -> real Celery worker (demo model) -> Postgres.
Short replies (max_tokens 8) keep it fast; temperature 0 makes replies comparable."""

from __future__ import annotations

import openai
import pytest
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from tenants.models import AuditEvent, AuditLog, Conversation

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
QUESTION = "What should I cook?"


@pytest.fixture
def base_url(live_server, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)  # the web reads the served model's context
    return f"{live_server.url}/v1"


@pytest.fixture
def sdk(base_url, member_key):
    return openai.OpenAI(base_url=base_url, api_key=member_key[1], max_retries=0, timeout=180)


def reference(sdk, text=QUESTION, max_tokens=8) -> str:
    """The same question through the official SDK: what every client must get back."""
    return sdk.chat.completions.create(model="kvinject", max_tokens=max_tokens, temperature=0,
                                       messages=[{"role": "user", "content": text}]
                                       ).choices[0].message.content


@pytest.fixture
def chat_openai(base_url, member_key):
    def make(**kw):
        kw = {"model": "kvinject", "max_tokens": 8, "temperature": 0, **kw}
        return ChatOpenAI(base_url=base_url, api_key=member_key[1], max_retries=0,
                          timeout=180, **kw)

    return make


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def test_langchain_invoke_stream_and_batch(chat_openai, sdk, gpu_worker, member_key):
    member, _ = member_key
    expected = reference(sdk)
    llm = chat_openai()
    answer = llm.invoke(QUESTION)
    assert isinstance(answer, AIMessage) and answer.content == expected
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    assert answer.usage_metadata["output_tokens"] <= 8
    assert answer.usage_metadata["total_tokens"] == (answer.usage_metadata["input_tokens"]
                                                     + answer.usage_metadata["output_tokens"])
    chunks = list(chat_openai(stream_usage=True).stream(QUESTION))
    assert "".join(c.content for c in chunks) == expected
    assert sum(c.usage_metadata["output_tokens"] for c in chunks if c.usage_metadata) \
        == answer.usage_metadata["output_tokens"]
    batch = llm.batch([QUESTION, "And tomorrow?"])
    assert batch[0].content == expected and isinstance(batch[1].content, str)
    # a multi-turn conversation is sent as the request's messages and stored with the reply
    turns = [SystemMessage("Answer briefly."), HumanMessage("Hi"), AIMessage("Hello!"),
             HumanMessage(QUESTION)]
    reply = llm.invoke(turns)
    conv = Conversation.objects.filter(tenant=member.tenant, member=member).latest("id")
    assert [m.content for m in conv.messages.order_by("id")] == [
        "Answer briefly.", "Hi", "Hello!", QUESTION, reply.content]


def test_langchain_bind_tools_answers_without_tool_calls(chat_openai, sdk, gpu_worker):
    """The served template cannot render tools: with tool_choice auto (LangChain's default)
    the model answers in text, a valid 'auto' outcome; 'required' is refused clearly."""
    expected = reference(sdk)
    answer = chat_openai().bind_tools([get_weather]).invoke(QUESTION)
    assert answer.content == expected and answer.tool_calls == []
    streamed = list(chat_openai().bind_tools([get_weather]).stream(QUESTION))
    assert "".join(c.content for c in streamed) == expected
    assert all(not c.tool_call_chunks for c in streamed)
    with pytest.raises(openai.BadRequestError) as err:
        chat_openai().bind_tools([get_weather], tool_choice="required").invoke(QUESTION)
    assert (err.value.code, err.value.param) == ("invalid_input", "tool_choice")


def test_langchain_error_mapping(chat_openai, base_url, demo_model_path):
    from tenants.api.context_limits import model_limits

    bad_key = ChatOpenAI(base_url=base_url, api_key="kvi_wrong", model="kvinject", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.invoke(QUESTION)
    with pytest.raises(openai.NotFoundError) as err:
        chat_openai(model="gpt-4o").invoke(QUESTION)
    assert err.value.code == "model_not_found"
    _, max_pos = model_limits(str(demo_model_path))
    with pytest.raises(ContextOverflowError) as err:  # LangChain's own context-length error
        chat_openai(max_tokens=max_pos).invoke(QUESTION)
    assert isinstance(err.value, openai.BadRequestError)
    assert err.value.param == "max_completion_tokens"  # what LangChain sends max_tokens as
    with pytest.raises(openai.BadRequestError) as err:
        chat_openai(logprobs=True).invoke(QUESTION)
    assert err.value.param == "logprobs"
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST).exists()


def test_llamaindex_openai_like_chat_and_stream(base_url, member_key, sdk, gpu_worker):
    expected = reference(sdk)
    llm = OpenAILike(model="kvinject", api_base=base_url, api_key=member_key[1],
                     is_chat_model=True, context_window=2048, max_tokens=8, temperature=0,
                     max_retries=0, timeout=180)
    ask = [ChatMessage(role="user", content=QUESTION)]
    answer = llm.chat(ask)
    assert answer.message.role == "assistant" and answer.message.content == expected
    deltas = list(llm.stream_chat(ask))
    assert "".join(d.delta or "" for d in deltas) == expected
    assert deltas[-1].message.content == expected
    assert llm.complete(QUESTION).text == expected  # a chat model: complete() chats too
    bad = OpenAILike(model="kvinject", api_base=base_url, api_key="kvi_wrong",
                     is_chat_model=True, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat(ask)


def test_litellm_sdk_reaches_the_platform_as_an_openai_backend(base_url, member_key, sdk,
                                                               gpu_worker, monkeypatch):
    """LiteLLM (what its proxy uses to call a backend): the ``openai/`` provider with
    ``api_base`` and a member's key. The proxy server itself is not started here."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm

    expected = reference(sdk)
    ask = dict(model="openai/kvinject", api_base=base_url, api_key=member_key[1],
               messages=[{"role": "user", "content": QUESTION}], max_tokens=8, temperature=0,
               num_retries=0, timeout=180)
    answer = litellm.completion(**ask)
    assert answer.choices[0].message.content == expected
    assert answer.usage.completion_tokens <= 8
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       litellm.completion(stream=True, **ask) if c.choices)
    assert streamed == expected
    with pytest.raises(litellm.BadRequestError) as err:  # refused here, LiteLLM maps it
        litellm.completion(**{**ask, "response_format": {"type": "json_object"}})
    assert "response_format: 'json_object' is not supported by this server" in str(err.value)
    with pytest.raises(litellm.AuthenticationError):
        litellm.completion(**{**ask, "api_key": "kvi_wrong"})
