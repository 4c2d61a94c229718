"""``POST /api/chat``: what its request and response fields mean (see the package)."""

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
                "`memory_reminder`, else the model's default (on unless its profile says off).",
    "constraints": "Decoding constraints: the standing instructions the decoder can keep "
                   "(lowercase, no commas, a banned word, an opening phrase, a word limit, "
                   "…); `false` = off. Default: the tenant's `decoding_constraints`, else the "
                   "model's default (on unless its profile says off).",
    "loop_guard": "The loop guard: the reply never says a run of its own tokens twice; "
                  "`false` = off. Default: the tenant's `loop_guard`, else the model's default "
                  "(its profile's; off without one).",
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
