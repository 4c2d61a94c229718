"""``POST /v1/chat/completions``: what its request fields and ``kvinject`` extras mean."""

from __future__ import annotations

# POST /v1/chat/completions: the ``kvinject`` extras of its own
V1_EXTENSION = {
    "conversation": "Append this exchange to one of your conversations (default: a new one "
                    "holding the request's messages and the reply).",
}

# POST /v1/chat/completions: request fields (OpenAI's names; the neutral ones are accepted only
# at their neutral value and are no serializer fields: NEUTRAL_V1)
V1_REQUEST = {
    "model": "The served model's id (`OPENAI_MODEL_ID`, default: the model directory's name) or "
             "an alias (`OPENAI_MODEL_ALIASES`, default `kvinject`); anything else is `404 "
             "model_not_found`.",
    "messages": "`system`, `developer`, `user` and `assistant` messages, content a string or a "
                "list of `{\"type\": \"text\"}` parts; the last is the user's new turn.",
    "max_completion_tokens": "The longest reply; default: until the model stops or the context "
                             "is full, at most `CHAT_MAX_NEW_TOKENS`. More than fits the "
                             "context: `400 context_length_exceeded`.",
    "max_tokens": "The same as `max_completion_tokens` (send one, or both equal).",
    "temperature": "0 … 2; default 1, as at OpenAI (`/api/chat` defaults to greedy); 0 = greedy.",
    "top_p": "Above 0, at most 1: nucleus sampling; default 1.",
    "seed": "With `temperature` above 0, the same seed gives the same reply.",
    "stop": "A string or up to 4: the reply ends before the first one generated "
            "(`finish_reason: \"stop\"`).",
    "stream": "`true`: server-sent `chat.completion.chunk` events, then `data: [DONE]`.",
    "stream_options": "`include_usage`: a last chunk with empty `choices` and the `usage`.",
    "n": "Only `1` (else `400`).",
    "user": "Your id for your end user, recorded in the audit row (`end_user`).",
    "tools": "Up to 128 function tools, validated and accepted; no served model's template "
             "renders them, so the model never sees them.",
    "tool_choice": "`auto` (the default) or `none`: the reply is text without tool calls; "
                   "`required` or a named function is a `400`.",
    "parallel_tool_calls": "Accepted, not used.",
    "response_format": "Only `{\"type\": \"text\"}` (the default); `json_object` and "
                       "`json_schema` are a `400`: the engine does not constrain output.",
    "metadata": "Up to 16 string pairs (keys ≤ 64, values ≤ 512 characters): accepted, not used.",
    "logprobs": "Only `false`: the engine returns no log probabilities.",
    "top_logprobs": "Only `null`: the engine returns no log probabilities.",
    "kvinject": "The platform's extras, below.",
}
NEUTRAL_V1 = {
    "frequency_penalty": "Only `0` or `null`: the engine has no penalties (else a `400` naming the field).",
    "presence_penalty": "Only `0` or `null`: the engine has no penalties (else a `400` naming the field).",
    "logit_bias": "Only `{}` or `null`: the engine has no biases (else a `400` naming the field).",
    "modalities": "Only `[\"text\"]` or `null` (else a `400` naming the field).",
}
