"""A request's data path: the prompt through the target in chunks (forward_hidden, then head on the last row), then
one forward pass per token, or a SpeculativeDecoder's rounds. Thin on purpose."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigError, ContextLengthError
from .models import Model
from .models.cache import Cache
from .prompt_cache import PromptCache
from .sampling import SamplingParams, greedy_token, is_int, next_token

if TYPE_CHECKING:  # the speculative package imports prefill_rows from here
    from .speculative.decoder import SpeculativeDecoder
    from .speculative.stats import RequestDraftStats

PREFILL_CHUNK = 256  # rows per prefill pass: bounds scratch memory, keeps the kernels in their fast M range


@dataclass
class Timings:
    """Seconds spent in prefill and in decode passes; the first generated token comes from the prefill pass."""

    n_prompt: int = 0
    n_generated: int = 0
    n_cached: int = 0  # prompt rows kept from the previous request (prompt cache): n_prompt - n_cached were prefilled
    prompt_s: float = 0.0
    decode_s: float = 0.0

    @property
    def n_prefilled(self) -> int:
        return self.n_prompt - self.n_cached

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.n_prompt / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens after the first (which the prefill pass yields) per second of decoding."""
        return (self.n_generated - 1) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class Generation:
    """One request's outcome, filled while its tokens stream."""

    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (end-of-generation or stop token) or "length"
    timings: Timings = field(default_factory=Timings)
    draft: RequestDraftStats | None = None  # this request's drafting statistics, when it drafted


def check_token_ids(prompt: Any, n_vocab: int) -> list[int]:
    """A token-id prompt as a list of ints, each in 0..n_vocab-1; anything else is a ConfigError naming the first
    bad id (bools, floats, strings, bytes and out-of-range ids are not token ids)."""
    if isinstance(prompt, (str, bytes, bytearray, memoryview)):
        raise ConfigError(f"a token-id prompt must be a sequence of ints, got {type(prompt).__name__}")
    try:
        items = list(prompt)
    except TypeError:
        raise ConfigError(f"a prompt must be text or a sequence of token ids, got {type(prompt).__name__}") from None
    for i, t in enumerate(items):
        if not (is_int(t) and 0 <= t < n_vocab):
            raise ConfigError(f"prompt token {i} is {t!r}, not a token id (an integer in 0..{n_vocab - 1})")
    return [int(t) for t in items]


def prefill_rows(model: Model, cache: Cache, prompt: Sequence[int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Run the prompt through the model continuing the cache at position cache.n, in chunks that end at multiples of
    PREFILL_CHUNK positions (so a prefill resumed by the prompt cache splits as a cold one does); yields each chunk's
    (positions (M,) int32, post-norm hidden (M, n_embd))."""
    ids = np.asarray(prompt, dtype=np.int32)
    pos0 = s = cache.n
    while s < pos0 + len(ids):
        e = min(pos0 + len(ids), (s // PREFILL_CHUNK + 1) * PREFILL_CHUNK)
        pos = np.arange(s, e, dtype=np.int32)
        yield pos, model.forward_hidden(ids[s - pos0 : e - pos0], pos, cache)
        s = e


def greedy_rows(model: Model, h: np.ndarray) -> list[int]:
    """Each row's arg-max token after hidden states h (M, n_embd): on the model's device when its class offers
    `argmax` (a device model: only the ids come back), else from its logits (a wrapper that forwards attributes,
    such as a batcher's lane, keeps its own `head`)."""
    fn = getattr(model, "argmax", None) if hasattr(type(model), "argmax") else None
    if fn is not None:
        return [int(t) for t in fn(h)]
    return [greedy_token(row) for row in model.head(h)]


class Engine:
    """Owns a model and its cache; serves one request at a time, plainly or through a SpeculativeDecoder built
    on the same model and cache."""

    def __init__(self, model: Model, n_ctx: int, prompt_cache: bool = False):
        if n_ctx < 2:
            raise ConfigError(f"context_length must be >= 2, got {n_ctx}")
        self.model = model
        self.n_ctx = n_ctx
        self.cache: Cache = model.make_cache(n_ctx)
        spans = (PREFILL_CHUNK, getattr(model, "chunked_prefill_min", None))
        self.prompt_cache = PromptCache(self.cache, spans) if prompt_cache else None

    def prefill(self, prompt: Sequence[int]) -> np.ndarray:
        """Run the prompt through the model after what the cache holds; returns the last position's logits
        (n_vocab,). The prompt cache forgets what it knew of the cache."""
        if self.prompt_cache is not None:
            self.prompt_cache.forget()
        return self._prefill(prompt)

    def _prefill(self, prompt: Sequence[int]) -> np.ndarray:
        last = deque(prefill_rows(self.model, self.cache, prompt), maxlen=1)  # only the last chunk is kept
        if not last:
            raise ConfigError("the prompt is empty: at least one token is needed")
        return self.model.head(np.ascontiguousarray(last[0][1][-1:]))[0]

    def check_fits(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt < 1:
            raise ConfigError("the prompt is empty: at least one token is needed")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
        if n_prompt + max_tokens > self.n_ctx:
            raise ContextLengthError(
                f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) = {n_prompt + max_tokens} exceeds the "
                f"context length of {self.n_ctx}"
            )

    def stream(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        stop_ids: frozenset[int] = frozenset(),
        gen: Generation | None = None,
        spec: SpeculativeDecoder | None = None,
    ) -> Iterator[int]:
        """Yield generated token ids; `gen` (if given) receives the tokens, finish reason and timings (the prompt's
        time runs to the first token). With `spec` the tokens come from speculative rounds (equal to plain
        decoding at temperature 0)."""
        gen = gen if gen is not None else Generation()
        prompt = check_token_ids(prompt, self.model.n_vocab)
        self.check_fits(len(prompt), max_tokens)
        if spec is not None and (spec.cache is not self.cache or spec.model is not self.model):
            raise ValueError("the SpeculativeDecoder must be built on this engine's model and cache")
        rng = np.random.default_rng(params.seed)
        t = gen.timings
        t.n_prompt = len(prompt)
        t.n_cached = start = self._start(prompt, spec, params, rng)
        decoder = spec.generate if spec is not None else self.generate
        tokens = decoder(list(prompt), max_tokens, params, rng, start)
        pc, broken = self.prompt_cache, False
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    tok = next(tokens)
                except BaseException:
                    broken = True
                    raise
                if t.n_generated == 0:
                    t.prompt_s = time.perf_counter() - t0
                    if pc is not None:
                        pc.prompt_done(prompt)
                else:
                    t.decode_s += time.perf_counter() - t0
                gen.tokens.append(tok)
                t.n_generated += 1
                yield tok
                if tok in stop_ids:
                    gen.finish_reason = "stop"
                    return
                if t.n_generated >= max_tokens:
                    gen.finish_reason = "length"
                    return
        finally:
            tokens.close()  # type: ignore[attr-defined]
            if pc is not None:
                pc.request_done(prompt + gen.tokens, broken)

    def _start(self, prompt: list[int], spec: SpeculativeDecoder | None, params: SamplingParams,
               rng: np.random.Generator) -> int:
        """Prompt rows kept from the previous request (0: a cold start, the cache emptied). The drafter, when
        there is one, must agree: it resumes on as many rows as its own state allows."""
        pc = self.prompt_cache
        if pc is None:
            self.cache.reset()
            return 0
        for rows, kind in pc.candidates(prompt):
            r = spec.resume(prompt, rows, params, rng) if spec is not None else rows
            if r == rows or (0 < r and not pc.recurrent):
                pc.keep(r, kind)
                return r
        pc.cold()
        return 0

    def generate(self, prompt: list[int], max_tokens: int, params: SamplingParams, rng: np.random.Generator,
                 start: int = 0) -> Iterator[int]:
        """Plain decoding: prefill what the cache does not hold (its first `start` rows are the prompt's), then one
        forward pass per token."""
        tok, pos = next_token(self._prefill(prompt[start:]), params, rng), len(prompt)
        yield tok
        for _ in range(max_tokens - 1):
            h = self.model.forward_hidden(np.array([tok], np.int32), np.array([pos], np.int32), self.cache)
            tok = greedy_rows(self.model, h)[0] if params.greedy else next_token(self.model.head(h)[0], params, rng)
            pos += 1
            yield tok
