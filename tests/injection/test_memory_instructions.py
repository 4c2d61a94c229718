"""Tenant instructions keep precedence with many memories (issue 22)."""

from __future__ import annotations

import re

import pytest

from injection import InjectionExecutor, TenantLRU
from injection.base import ExecutionRequest, MemoryItem
from injection.engine.batch import BatchEngine
from injection.metrics import Metrics

FRENCH = {"le", "la", "les", "est", "et", "je", "vous", "une", "un", "pour", "avec", "des",
          "bonjour", "merci", "que", "pas", "du", "suis", "de"}
MEMORIES = ["My sister lives in Dublin.", "I collect vintage postcards.",
            "I go swimming on Tuesdays.", "My office is on the fifth floor.",
            "I am learning to knit.", "My favourite film is Casablanca.",
            "I grow tomatoes on my balcony.", "My neighbour is a retired teacher.",
            "I wake up at six every morning.", "I enjoy crossword puzzles.",
            "My grandmother was a painter.", "I have two goldfish.",
            "I visited Peru last year.", "My phone is always on silent.", "I keep a diary.",
            "I am left-handed.", "My birthday is in October.", "I enjoy jigsaw puzzles.",
            "I wear glasses for reading.", "I prefer short answers."]


def french(text: str) -> bool:
    words = re.findall(r"[\w']+", text.lower())
    return len(words) >= 3 and sum(w in FRENCH for w in words) / len(words) >= 0.2


@pytest.mark.slow
@pytest.mark.real_model
def test_tenant_instruction_still_holds_with_twenty_memories(smollm):
    ex = InjectionExecutor(smollm, l1=TenantLRU(max_bytes=1024**3), l2=None, alpha_cap=1.0,
                           metrics=Metrics(), engine=BatchEngine(smollm, max_batch=2))
    msgs = [{"role": "user", "content": "How are you today?"}]
    replies = {}
    try:
        for n in (0, 20):
            mems = tuple(MemoryItem(str(i), t) for i, t in enumerate(MEMORIES[:n]))
            res = ex.execute(ExecutionRequest("acme", "ann", msgs, memories=mems,
                                              instructions="Always answer in French.",
                                              max_new_tokens=24))
            replies[n] = res
    finally:
        ex.close()
    assert french(replies[0].text), replies[0].text
    assert french(replies[20].text), replies[20].text  # the memories did not override it
    assert len(replies[20].extra["memories_used"]) == 20
