"""A second model's judgement of whether a reply makes sense (bench_quality's word-salad check).

bench_quality's checks pass a reply on its form: IFEval's language verifier (``langdetect``)
passes "Les moussres sont toujours bonnes, monsieurs." as French. A *judge* model scores a
reply by how likely it finds it as its own answer: the mean negative log-likelihood per
token (nats) of the reply after the question, with the member's memory as the system
message, from the reply's 4th token on (the language it chose is not scored; a reply of 6
tokens or fewer: every token). Text a
capable model would write scores low in any language; word salad scores high.

``SENSIBLE_NLL`` is the line, chosen on tuning replies (docs/benchmarks/quality.md,
"judge"): SmolLM2-135M's English replies to the standing instructions 75 of 75 under it
(median 1.80), its replies in French or Spanish that pass the language check 4 of 45 (median
3.89), the judge's own French and Spanish 99 of 99 (median 0.9-1.0).

The judge is Qwen2.5-Coder-0.5B-Instruct (``manage.py prepare_model --model
qwen2.5-coder-0.5b``), float32 on the CPU; scores are kept in a JSON file by the hash of
(memory, question, reply), so a reply is scored once across runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "var" / "models" / "qwen2.5-coder-0.5b"
CACHE = ROOT / "var" / "judge-scores-2.json"  # (2: short replies scored whole)
SKIP = 3  # the reply's first tokens (its choice of language) are not scored
SENSIBLE_NLL = 3.0


class Judge:
    """``score(memory, question, reply)``: the judge's mean NLL a token (None: empty)."""

    def __init__(self, path: Path = JUDGE, cache: Path = CACHE) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        self.cache_path = cache
        self.cache: dict[str, float | None] = (
            json.loads(cache.read_text()) if cache.exists() else {})

    def score(self, memory: str, question: str, reply: str) -> float | None:
        key = hashlib.sha1(f"{memory}\x00{question}\x00{reply}".encode()).hexdigest()
        if key not in self.cache:
            self.cache[key] = self._score(memory, question, reply)
        return self.cache[key]

    def save(self) -> None:
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        self.cache_path.write_text(json.dumps(self.cache))

    def _score(self, memory: str, question: str, reply: str) -> float | None:
        msgs = [{"role": "system", "content": memory}, {"role": "user", "content": question}]
        head = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        head_ids = self.tok(head, add_special_tokens=False).input_ids
        reply_ids = self.tok(reply, add_special_tokens=False).input_ids
        if not reply_ids:
            return None
        skip = SKIP if len(reply_ids) > 2 * SKIP else 0  # a short reply: every token
        ids = torch.tensor([head_ids + reply_ids])
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        return float(nll[len(head_ids) - 1 + skip:].mean())


def sensible(score: float | None) -> bool:
    """Whether a judged reply makes sense (an empty one, None, is left to the fluency check)."""
    return score is None or score < SENSIBLE_NLL
