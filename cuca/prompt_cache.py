"""The prompt cache: what an Engine's cache holds between requests, and how much of it the next prompt keeps.

After a request the target's cache holds every token it was fed (the prompt, then the generated tokens but the
last). The next prompt keeps the rows of its longest common prefix with them and is prefilled from there on, so a
multi-turn chat prefills only its new turn. Kept rows are the rows a cold run computes: a K/V row depends only on
the tokens up to it and every kernel is batch invariant, so any prefix of a K/V cache may be kept. A recurrent
state (the Qwen 3.5 hybrid) cannot be rolled back: three states are on offer, the live one (after the last fed
token), a checkpoint at the end of the previous prompt, each only when the new prompt extends its tokens exactly and
a cold prefill would compute that very state (`recurrent_exact`), and the state after the previous prompt's last
full prefill chunk (which a cold prefill of any prompt sharing those tokens reaches); otherwise the request starts
cold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .models.cache import Cache


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def recurrent_exact(c: int, prev_prompt: int, prompt: int, spans: tuple[int, int | None]) -> bool:
    """Whether the recurrent state after the first `c` tokens, left by the previous request (prompt of `prev_prompt`
    tokens, prefilled in chunks of `spans[0]` rows at multiples of it, then decoded row by row), is bit for bit the
    state a cold prefill of the new `prompt`-token prompt reaches at `c`. Batches of at least `spans[1]` rows (None:
    none) take a chunked form whose rounding depends on where the batch starts, so the state must sit on a chunk
    boundary, or the chunk holding it must be short enough for the row-by-row form in both runs."""
    chunk, chunked_min = spans
    base = c // chunk * chunk
    if base > prev_prompt:  # the full chunks before c were decoded, not prefilled as a cold run does
        return False
    if c == base:
        return True
    return chunked_min is None or min(base + chunk, prompt) - base < chunked_min


@dataclass
class _Mark:
    """The previous prompt and the cache's checkpoint right after its prefill (recurrent caches; None for K/V), and
    the one at the end of its last full prefill chunk (position, state), which any prompt sharing that much reaches
    in a cold prefill too."""

    ids: list[int]
    state: Any
    boundary: tuple[int, Any] | None = None


class PromptCache:
    """Bookkeeping of one Engine's cache across requests (the engine calls it; nothing here runs the model)."""

    def __init__(self, cache: Cache, spans: tuple[int, int | None]):
        self.cache = cache
        self.spans = spans  # (prefill chunk, smallest chunked batch of a recurrent model, or None: no chunked form)
        self.recurrent = callable(getattr(cache, "snapshot", None))
        if self.recurrent:
            cache.save_every = spans[0]  # type: ignore[attr-defined]
        self._live: list[int] | None = None  # the tokens at positions 0..cache.n-1 after the last request
        self._n = -1  # cache.n when _live was recorded: any other value means someone else used the cache
        self._mark: _Mark | None = None

    def candidates(self, prompt: Sequence[int]) -> list[tuple[int, str]]:
        """Rows of `prompt` the cache can keep, best first, as (rows, "live" | "mark"); at least one prompt row is
        always left to prefill (its logits give the first token)."""
        if self.cache.n != self._n:
            self.forget()
            return []
        limit = len(prompt) - 1
        if not self.recurrent:
            known = self._live if self._live is not None else (self._mark.ids if self._mark else [])
            k = min(common_prefix(known, prompt), limit, self.cache.n)
            return [(k, "live")] if k > 0 else []
        out = []
        prev = len(self._mark.ids) if self._mark is not None else 0
        for kind, ids in (("live", self._live), ("mark", self._mark.ids if self._mark else None)):
            if ids is None:
                continue
            c = len(ids)
            if 0 < c <= limit and list(prompt[:c]) == ids and recurrent_exact(c, prev, len(prompt), self.spans):
                out.append((c, kind))
        b = self._mark.boundary if self._mark is not None else None
        if b is not None and self._mark is not None and 0 < b[0] <= limit and \
                list(prompt[: b[0]]) == self._mark.ids[: b[0]]:
            out.append((b[0], "boundary"))
        return out

    def keep(self, rows: int, kind: str) -> None:
        """Leave the first `rows` positions of the chosen candidate in the cache (the request prefills the rest)."""
        cache: Any = self.cache
        if kind == "mark" and self.recurrent and self._mark is not None:
            cache.restore(self._mark.state)
        elif kind == "boundary" and self._mark is not None and self._mark.boundary is not None:
            cache.restore(self._mark.boundary)
        cache.trim(cache.n - rows)
        self.forget()  # nothing else stays valid while this request writes the cache

    def cold(self) -> None:
        self.cache.reset()
        self.forget()

    def forget(self) -> None:
        self._live, self._mark, self._n = None, None, -1
        if self.recurrent:
            self.cache.saved = None  # type: ignore[attr-defined]

    def prompt_done(self, prompt: Sequence[int]) -> None:
        """The prefill finished: the cache holds exactly `prompt`; keep its checkpoint."""
        cache: Any = self.cache
        saved = cache.saved if self.recurrent else None
        self._mark = _Mark(list(prompt), cache.snapshot() if self.recurrent else None, saved)

    def request_done(self, known: list[int], broken: bool) -> None:
        """The request ended; `known` are the prompt and the tokens it emitted (the cache holds a prefix of them,
        or more: drafts accepted past the point where the caller stopped). `broken`: it raised mid-pass."""
        cache = self.cache
        if not broken and cache.n > len(known):
            try:
                cache.trim(cache.n - len(known))
            except ValueError:  # a recurrent state that cannot roll back that far: only the checkpoint stays
                broken = True
        self._live = None if broken else known[: cache.n]
        self._n = cache.n
