"""What a chat attempt has used so far, so that one failing after it generated is billed.

A generation can fail after its stream delivered text: the task's soft time limit, an
accelerator OOM, the engine's watchdog (or its reply can fail to be stored). The engine reports the tokens it had generated
(``ExecutionRequest.on_failure``) and the budgets' ``admit`` the prompt it was admitted
with; :meth:`Attempt.failed` bills them once (``tenants.actions.do_record_failed``, a
``chat.failed`` audit row, unique per request id with the other billing rows). An attempt
that failed before its first token bills nothing (the web counts its error).
"""

from __future__ import annotations

import dataclasses
import logging

from injection.base import ExecutionRequest
from tenants.actions import do_record_failed
from tenants.models import Member

log = logging.getLogger(__name__)


class Attempt:
    def __init__(self, member: Member, request_id: str) -> None:
        self.member, self.request_id = member, request_id
        self.prompt_tokens = 0  # the prompt the budgets admitted (0: not admitted yet)
        self.completion_tokens = 0  # generated when the generation failed

    def watching(self, req: ExecutionRequest) -> ExecutionRequest:
        """``req`` reporting to this attempt: its ``admit`` (kept) and ``on_failure``."""
        inner = req.admit

        def admit(prompt_tokens: int) -> int:
            granted = inner(prompt_tokens) if inner is not None else req.max_new_tokens
            self.prompt_tokens = int(prompt_tokens)
            return granted

        return dataclasses.replace(req, admit=admit, on_failure=self.generated)

    def generated(self, tokens: int) -> None:
        self.completion_tokens = max(0, int(tokens))

    def failed(self, exc: BaseException, result=None) -> None:
        """The attempt failed with ``exc`` (``result``: the reply it had generated, when
        storing it failed): bill what it generated, if anything, unless it was billed
        already. Never raises over ``exc`` (Postgres down: logged, the reservation lapses)."""
        if result is not None:
            self.prompt_tokens, self.completion_tokens = (result.prompt_tokens,
                                                          result.completion_tokens)
        if self.completion_tokens <= 0:
            return
        try:
            billed = do_record_failed(self.member, self.request_id,
                                      prompt_tokens=self.prompt_tokens,
                                      completion_tokens=self.completion_tokens,
                                      error=type(exc).__name__)
        except Exception as fault:
            log.warning("chat request_id=%s: failed attempt not billed: %r", self.request_id,
                        fault)
            return
        log.info("chat request_id=%s failed (%s) after %d tokens (%s)", self.request_id,
                 type(exc).__name__, self.completion_tokens,
                 "billed" if billed else "billed already")
