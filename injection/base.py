"""Interfaces and small value types of the injection engine.

Plain torch + transformers + redis: nothing in ``injection`` imports Django.
Everything the worker needs goes through :class:`ExecutionRequest` ->
``InjectionExecutor.execute`` -> :class:`ExecutionResult`.
"""

from __future__ import annotations

import enum
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from injection.kvcache.packed import PackedKV
    from injection.prompting.rules import MemoryRules


# The measured default value scaling and its cap (docs/BENCHMARKS.md, personalisation).
DEFAULT_ALPHA = 1.0
ALPHA_CAP = 1.0


def content_hash(preference_text: str) -> str:
    """SHA-256 hex of the preference text: the content part of a cache key (and what the
    platform reports and audits as the preference's hash)."""
    return hashlib.sha256(preference_text.encode("utf-8")).hexdigest()


def run_here(kind: str, fn: Callable[[], Any]) -> Any:
    """Run a forward of ``kind`` on the caller's thread: where no batch engine runs them
    (``BatchEngine.forward``, ``engine/prefill/forwards.py``, takes the same arguments)."""
    return fn()


class Tier(str, enum.Enum):  # noqa: UP042 (str() stays "Tier.L1"; use .value)
    """Where the preference K/V of a request came from."""

    L1 = "l1"  # this process's CPU LRU
    L2 = "l2"  # Redis, HMAC-authenticated
    COMPUTE = "compute"  # recomputed by a forward pass (L3)
    NONE = "none"  # no injection (disabled, empty preference, alpha too low)


class CacheKey(NamedTuple):
    """Identity of one cached PackedKV.

    ``content_hash`` is SHA-256 of the preference text; ``fingerprint``
    identifies model weights + tokenizer + dtype. A changed preference text
    or model therefore never maps to an old entry.
    """

    tenant: str
    user: str
    content_hash: str
    fingerprint: str


class SegmentSplit(NamedTuple):
    """The injected system turn split token-exactly: the tenant's part, then the member's.

    ``tenant_ids + member_ids`` are exactly the ids of the whole turn (first=True), so
    the member's K/V computed as a continuation of the tenant's equals the whole turn's.
    """

    tenant_text: str  # template header + tenant instructions (the same for every member)
    tenant_ids: tuple[int, ...]
    member_text: str  # the member's preference + the end of the system turn
    member_ids: tuple[int, ...]


class MemoryItem(NamedTuple):
    """One of a member's memories, as the engine sees it (ordered, enabled ones only)."""

    id: str  # the platform's memory id, opaque to the engine
    text: str
    pinned: bool = False
    # the rules read from the text when it was saved (``prompting/rules.py``; ``rules.NONE``:
    # switched off); None: the engine reads the text itself
    rules: MemoryRules | None = None


class GenerationOutput(NamedTuple):
    text: str
    token_ids: list[int]  # generated ids only
    prompt_token_ids: list[int]  # prompt ids (without the injected prefix)
    kv_transfer_ms: float = 0.0  # injected K/V host->device + cache build
    kv_bytes_gpu: int = 0  # accelerator bytes peaked while building the cache (0 on CPU)
    finish_reason: str = "length"  # stop (stop string or end of sequence) | length | cancelled
    first_token_ms: float = 0.0  # from the start of generate() to the first generated token
    sequence_kv: Any = None  # PackedKV of the whole sequence, when asked (conversation reuse)
    # a guided row's guide (engine/guidance/contrast.py): the tokens it prefilled (after
    # its prefix K/V, which came from a cache) and the row's tokens it was fed in decoding
    guide_prefill_tokens: int = 0
    guide_decode_tokens: int = 0
    # a probe row (engine/guidance/probe.py): its first token's ``[V]`` log-probability
    # difference to its guide's and the mean of its decoding steps'
    leans: Any = None


@dataclass(frozen=True)
class ExecutionRequest:
    """One chat generation. ``user`` None means: compute, never cache.

    ``messages`` is the conversation (history oldest-first, then the new user turn);
    the engine renders it after the system turn it injects (``instructions`` then
    ``preference_text``) and trims the history to the model's context.
    """

    tenant: str
    user: str | None
    messages: tuple[dict[str, str], ...] | list[dict[str, str]]
    preference_text: str = ""
    instructions: str = ""  # tenant-wide, first in the system turn
    injection_enabled: bool = True
    alpha: float = 1.0
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 -> greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # the reply ends before the first of these strings
    # streaming: called with each piece of final text; generation stops once cancelled()
    on_text: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    cancelled: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    # budgets: called once before generating with the prompt's token count (what
    # ``prompt_tokens`` will report); returns the tokens it may generate (the generation
    # is capped to it), or raises to refuse it before anything is generated
    admit: Callable[[int], int] | None = field(default=None, compare=False, repr=False)
    # billing: called once if the generation fails after it was admitted (its caller's time
    # limit, an OOM, the engine stopping), with the completion tokens generated until then
    on_failure: Callable[[int], None] | None = field(default=None, compare=False, repr=False)
    history_token_budget: int | None = None  # cap on history tokens (None: context only)
    reuse_conversation: bool = True  # continue the conversation's cached K/V when possible
    # the caller's stable id of the conversation (/api/chat: the stored one); None: the
    # conversation is known by the hash chain of its messages (/v1)
    conversation_id: str | None = None
    # the member's memories (ordered, enabled only); when non-empty they render the
    # member part of the system turn and ``preference_text`` is ignored
    memories: tuple[MemoryItem, ...] = ()
    # re-state the member's memories before each user turn once the conversation is deep
    # (injection/prompting/reminder.py); None = the model's default (model/profiles.default_on)
    reminder: bool | None = None
    # contrastive guidance strength (injection/engine/guidance/contrast.py): the member's memories
    # as the difference between the reply's distribution with and without them, on turns
    # that carry no reminder; 0 = off, exactly today's output; None = the model's default
    contrast: float | None = None
    # keep the member's standing instructions the decoder can keep ("answer in lowercase",
    # "never use commas": injection/prompting/constraints.py); None = the model's default
    constrain: bool | None = None
    # the loop guard: the reply never repeats a run of its own tokens
    # (injection/engine/decoding/loops.py); None = the model's default (model/profiles)
    loop_guard: bool | None = None
    # the rules read from ``instructions`` when they were saved (``prompting/rules.py``;
    # ``rules.NONE``: none); None: the engine reads the instructions itself
    instruction_rules: MemoryRules | None = None


@dataclass
class ExecutionResult:
    """Reply plus per-request K/V metrics (reported in the API's ``cache``)."""

    text: str
    tier: Tier
    prompt_tokens: int
    completion_tokens: int
    alpha_effective: float = 0.0
    content_hash: str = ""
    fingerprint: str = ""
    kv_tokens: int = 0
    kv_layers_count: int = 0
    kv_bytes_cpu: int = 0
    kv_bytes_gpu_peak: int = 0
    kv_transfer_latency_ms: float = 0.0
    kv_fetch_latency_ms: float = 0.0  # L1/L2 lookup or compute time
    inference_latency_ms: float = 0.0
    ttft_ms: float = 0.0  # request start (incl. the K/V lookup) to the first generated token
    stripped_count: int = 0
    injection_mode: str = "none"  # system | user_prefix | inline | none (see prompting)
    history_messages: int = 0  # history messages that fitted the context
    finish_reason: str = "length"  # stop | length | cancelled (see injection.engine.stopping)
    reused_tokens: int = 0  # leading tokens whose K/V came from the conversation's last turn
    # prompt tokens (of ``prompt_tokens``, which counts the injected turn too) whose K/V
    # was served from a cache (L1/L2 segments, the conversation's), not recomputed
    cached_tokens: int = 0
    contrast_effective: float = 0.0  # the strength applied (0: no guide row)
    # the decoding constraints the reply was kept to (injection/prompting/constraints.py)
    constraints: list[str] = field(default_factory=list)
    # the guide row's work, never part of prompt_tokens / completion_tokens (the reply's):
    # tokens it prefilled (computed, not cached) and decoding steps it ran beside the reply
    guide_prefill_tokens: int = 0
    guide_decode_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def cache_info(self) -> dict[str, Any]:
        """JSON-safe dict for the API response's ``cache`` object."""
        d = asdict(self)
        d.pop("text")
        d["tier"] = self.tier.value
        return d


class KVStore(ABC):
    """A cache tier holding PackedKV on CPU, partitioned by tenant."""

    @abstractmethod
    def get(self, key: CacheKey) -> PackedKV | None:
        """Return the entry or None. Never returns a foreign tenant's entry."""

    @abstractmethod
    def put(self, key: CacheKey, kv: PackedKV) -> bool:
        """Store; returns False when the entry was not stored (too large, queue full)."""

    @abstractmethod
    def evict(self, tenant: str, user: str | None = None) -> int:
        """Drop every entry of ``tenant`` (and ``user`` if given); returns count."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters and sizes, JSON-safe, with a ``per_tenant`` breakdown."""


class PreferenceModel(ABC):
    """What the executor needs from a model (see ``adapter.ModelAdapter``)."""

    fingerprint: str
    device: Any
    dtype: Any

    @abstractmethod
    def compute_kv(self, text: str) -> PackedKV:
        """One forward pass over ``text``; K/V on CPU (pinned when CUDA is present)."""

    @abstractmethod
    def generate(
        self,
        prompt: str,
        injected: PackedKV | None,
        alpha: float,
        max_new_tokens: int,
        **sampling: Any,
    ) -> GenerationOutput:
        """Generate with ``injected`` as past_key_values, values scaled by ``alpha``."""

    @abstractmethod
    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Apply the tokenizer's chat template with a generation prompt."""

    @abstractmethod
    def split_prompt(self, context: str, messages: list[dict[str, str]]) -> Any:
        """``PromptParts``: ``context`` as the system turn (injected) and the rest."""

    @abstractmethod
    def plain_prompt(self, context: str, messages: list[dict[str, str]]) -> str:
        """The whole prompt with ``context`` as text (nothing injected)."""

    @abstractmethod
    def prompt_tokens(self, context: str, messages: list[dict[str, str]]) -> int:
        """Tokens of the conversation with ``context`` (what the model attends to)."""

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Token count of ``text`` without special tokens."""

    # -- optional: segment chains (a model without them injects one whole segment) --
    def split_segment(self, segment: str, context: str, instructions: str) -> SegmentSplit | None:
        """``segment`` (the rendered turn of ``context``) as tenant + member ids, or None."""
        return None

    def compute_kv_ids(self, ids: list[int] | tuple[int, ...],
                       parent: PackedKV | None = None) -> PackedKV:
        """K/V of ``ids`` continuing ``parent`` (None: they start the sequence); holds only
        ``ids``' tokens."""
        raise NotImplementedError
