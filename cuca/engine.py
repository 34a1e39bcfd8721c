"""The plain generation loop: batched prefill, then one forward pass per token. Thin on purpose."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ConfigError, ContextLengthError
from .models.cache import KVCache
from .sampling import SamplingParams, next_token
from .speculative.drafters import Drafter
from .speculative.governor import Governor
from .speculative.loop import speculative_tokens
from .speculative.stats import RequestDraftStats

PREFILL_CHUNK = 256  # rows per prefill pass: bounds scratch memory, keeps the kernels in their fast M range


@dataclass
class Timings:
    """Seconds spent in prefill and in decode passes; the first generated token comes from the prefill pass."""

    n_prompt: int = 0
    n_generated: int = 0
    prompt_s: float = 0.0
    decode_s: float = 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.n_prompt / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens after the first (which the prefill pass yields) per second of decoding."""
        return (self.n_generated - 1) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class Speculation:
    """How a request drafts: the drafter, drafts per round, the model's governor, and where the stats go."""

    drafter: Drafter
    draft_tokens: int
    governor: Governor
    stats: RequestDraftStats
    rollback_limit: int | None = None


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
        if not (isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)) and 0 <= t < n_vocab):
            raise ConfigError(f"prompt token {i} is {t!r}, not a token id (an integer in 0..{n_vocab - 1})")
    return [int(t) for t in items]


class Engine:
    """Owns a model and its cache; serves one request at a time."""

    def __init__(self, model: Any, n_ctx: int):
        if n_ctx < 2:
            raise ConfigError(f"context_length must be >= 2, got {n_ctx}")
        self.model = model
        self.n_ctx = n_ctx
        self.cache: KVCache = model.make_cache(n_ctx)

    def prefill(self, prompt: Sequence[int], pos0: int = 0, hidden: list[np.ndarray] | None = None) -> np.ndarray:
        """Run the prompt through the model in chunks; returns the last position's logits (n_vocab,). With
        `hidden`, the chunks' post-norm hidden states are appended to it (for drafters that read them)."""
        ids = np.asarray(prompt, dtype=np.int32)
        logits = None
        for s in range(0, len(ids), PREFILL_CHUNK):
            chunk = ids[s : s + PREFILL_CHUNK]
            pos = np.arange(pos0 + s, pos0 + s + len(chunk), dtype=np.int32)
            if hidden is None:
                logits = self.model.forward(chunk, pos, self.cache, "last")
            else:
                h = self.model.forward_hidden(chunk, pos, self.cache)
                hidden.append(h)
                logits = self.model.head(np.ascontiguousarray(h[-1:]))
        assert logits is not None
        return logits[0]

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
        spec: Speculation | None = None,
    ) -> Iterator[int]:
        """Yield generated token ids; `gen` (if given) receives the tokens, finish reason and timings. With `spec`
        the tokens come from speculative rounds (equal to plain decoding at temperature 0)."""
        gen = gen if gen is not None else Generation()
        prompt = check_token_ids(prompt, self.model.n_vocab)
        self.check_fits(len(prompt), max_tokens)
        rng = np.random.default_rng(params.seed)
        t = gen.timings
        t.n_prompt = len(prompt)
        self.cache.reset()
        t0 = time.perf_counter()
        hidden: list[np.ndarray] | None = [] if spec is not None and spec.drafter.uses_hidden else None
        logits = self.prefill(prompt, hidden=hidden)
        t.prompt_s = time.perf_counter() - t0
        tok = next_token(logits, params, rng)
        if spec is None:
            rest = self._plain(prompt, tok, max_tokens, params, rng)
        else:
            rest = speculative_tokens(
                self.model,
                self.cache,
                tok,
                list(prompt),
                max_tokens,
                params,
                rng,
                spec.drafter,
                spec.draft_tokens,
                spec.governor,
                spec.stats,
                spec.rollback_limit,
                np.concatenate(hidden) if hidden else None,
            )
        while True:
            gen.tokens.append(tok)
            t.n_generated += 1
            yield tok
            if tok in stop_ids:
                gen.finish_reason = "stop"
                return
            if t.n_generated >= max_tokens:
                gen.finish_reason = "length"
                return
            t0 = time.perf_counter()
            tok = next(rest)
            t.decode_s += time.perf_counter() - t0

    def _plain(
        self, prompt: Sequence[int], first: int, max_tokens: int, params: SamplingParams, rng: np.random.Generator
    ) -> Iterator[int]:
        tok, pos = first, len(prompt)
        for _ in range(max_tokens - 1):
            logits = self.model.forward(np.array([tok], np.int32), np.array([pos], np.int32), self.cache, "last")
            tok = next_token(logits[0], params, rng)
            pos += 1
            yield tok
