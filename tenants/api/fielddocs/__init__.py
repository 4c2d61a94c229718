"""What the API's fields mean, written once: the OpenAPI schema's help texts (``/api/docs``)
and docs/API.md's field tables say the same, word for word (``tests/test_reference.py``
checks each table row against this module; the docs may add links, nothing else).

One line each, at most 40 words; how a feature behaves is told below docs/API.md's tables.
"""

from __future__ import annotations

# POST /api/chat: request fields (``/v1``'s ``kvinject`` extras share the platform ones)
CHAT_REQUEST = {
    "conversation": "One of your conversation ids, to continue it; omit it to start a new "
                    "conversation.",
    "temperature": "0 … 2; 0 = greedy (the default).",
    "top_p": "0.01 … 1: nucleus sampling; default 1.",
    "alpha": "0 … 1: injection strength override, scaling the injected values only (keys "
             "never); capped at `KV_ALPHA_CAP`; default: your preference's alpha.",
    "emphasis": "Removed: `0` or `null` is accepted and does nothing, so older clients keep "
                "working; any other value is a `400` naming the field.",
    "contrast": "0 … 4: contrastive guidance by your memories at this strength; 0 = off. "
                "Default: the tenant's `memory_contrast`, else the model's default, only for "
                "memories holding a standing instruction the decoding constraints do not keep.",
    "reminder": "The memory reminder: your memories re-stated at the start of your messages "
                "deep in a conversation; `false` = off. Default: the tenant's "
                "`memory_reminder`, else on.",
    "constraints": "Decoding constraints: the standing instructions the decoder can keep "
                   "(lowercase, no commas, a banned word, an opening phrase, a word limit, "
                   "…); `false` = off. Default: the tenant's `decoding_constraints`, else on.",
}

# POST /v1/chat/completions: the ``kvinject`` extras of its own
V1_EXTENSION = {
    "conversation": "Append this exchange to one of your conversations (default: a new one "
                    "holding the request's messages and the reply).",
}

# POST /api/chat: response fields
CHAT_RESPONSE = {
    "usage.cached_tokens": "Of `prompt_tokens`, those whose K/V came from a cache (tenant "
                           "segment, member segment, the conversation's previous turn).",
    "usage.guide_prefill_tokens": "Tokens contrastive guidance computed before its first "
                                  "step (a guide row's prefill, the anchor's two prompts, or "
                                  "the probes of a lean this reply measured). Not in "
                                  "`prompt_tokens`; 0 when not guided.",
    "usage.guide_decode_tokens": "Decoding steps contrastive guidance ran beside the reply "
                                 "(a guide row's, at most 4, or the probes' of a lean this "
                                 "reply measured). Not in `completion_tokens`; 0 when not "
                                 "guided.",
    "cache.contrast_effective": "The guidance strength applied to this reply; 0: not guided "
                                "(which turns are guided: \"Contrastive guidance\").",
    "cache.constraints": "The decoding constraints this reply was kept to, e.g. `lowercase`, "
                         "`no_comma`, `ban:<word>`, `start:<phrase>`, `max_words:<k>`; `[]`: "
                         "none.",
    "cache.reused_tokens": "Leading tokens (system turn, history) whose K/V was continued "
                           "from the conversation's previous turn instead of prefilled.",
}

# GET /api/memories (each memory), GET /api/preference: the rules read from the text; PATCH
# of either: the switch (issue 57)
MEMORY_RULES = {
    "rules": "What the text asks of every reply, read once when it was saved: `constraints` "
             "the decoder keeps (e.g. `lowercase`), the reply `language`, `standing` (an "
             "instruction on how to answer) and `enabled` (your switch).",
    "rules_enabled": "`false` switches the rules off: the text stays in your replies as a "
                     "memory, but no constraint, language guidance or standing instruction "
                     "comes from it; `true` switches them on again. Audited.",
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
