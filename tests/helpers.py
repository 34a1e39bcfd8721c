"""Shared test helpers: plain and speculative runs on an Engine, a scripted drafter, cache equality, chi-square."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from cuca.engine import Engine, Generation
from cuca.sampling import SamplingParams
from cuca.speculative import AlwaysDraft, Proposal, RequestDraftStats, SpeculativeDecoder
from cuca.speculative.drafters import Drafter
from cuca.speculative.governor import Governor, GovernorEvent

GREEDY = SamplingParams()

# A target and how to bind its drafter to an engine (a drafter may read the engine's cache or need its n_ctx).
Pair = tuple[Any, Callable[[Engine], Drafter]]


def plain(model: Any, prompt: list[int], max_tokens: int, n_ctx: int = 128,
          stop: frozenset[int] = frozenset()) -> tuple[list[int], Engine, Generation]:
    """Greedy plain decoding on a fresh engine: (tokens, engine, generation)."""
    eng = Engine(model, n_ctx)
    gen = Generation()
    return list(eng.stream(prompt, max_tokens, GREEDY, stop, gen)), eng, gen


def spec(pair: Pair, prompt: list[int], max_tokens: int, k: int | Governor, n_ctx: int = 128,
         stop: frozenset[int] = frozenset()) -> tuple[list[int], Engine, Generation, RequestDraftStats]:
    """Greedy speculative decoding on a fresh engine: (tokens, engine, generation, stats). `k` drafts every round
    (AlwaysDraft); a Governor (a Cycle) picks each round's length instead, up to 16."""
    model, make = pair
    eng = Engine(model, n_ctx)
    gen = Generation()
    governor, n = (AlwaysDraft(), k) if isinstance(k, int) else (k, 16)
    s = SpeculativeDecoder(eng.model, eng.cache, make(eng), governor, n)
    return list(eng.stream(prompt, max_tokens, GREEDY, stop, gen, s)), eng, gen, s.stats


class Cycle:
    """A Governor that gives the round lengths in `lengths` in turn (capped by the room each round has), and keeps
    what it was told: variable round lengths, plain rounds among them, must not change a greedy token."""

    event_count = 0

    def __init__(self, lengths: list[int]):
        self.lengths, self.i = lengths, 0
        self.rounds: list[tuple[int, int, int, int]] = []  # (room, length decided, drafts proposed, accepted)
        self._room = self._asked = 0
        self.requests = 0  # begin_request calls: one per request, before its first round

    def begin_request(self) -> None:
        self.requests += 1

    def decide(self, limit: int, force: bool = False) -> int:
        assert self.requests > 0, "a round before begin_request"
        self._room, self.i = limit, self.i + 1
        self._asked = min(self.lengths[(self.i - 1) % len(self.lengths)], limit)
        return self._asked

    def record(self, depth: int, accepted: int, seconds: float) -> None:
        self.rounds.append((self._room, self._asked, depth, accepted))
        self._room = self._asked = 0

    def events_since(self, event_count: int) -> list[GovernorEvent]:
        return []


class Scripted:
    """Proposes from a script: `future[i]` is the token at position `start + i` (the target's own continuation:
    every draft accepted), or that token shifted by one id with `wrong` (none accepted). With `inner`, the real
    drafter runs too (so its state is exercised) and the script replaces as many drafts as it proposed."""

    def __init__(self, future: list[int], start: int, wrong: bool = False, inner: Drafter | None = None):
        self.future, self.start, self.wrong, self.inner = future, start, wrong, inner
        self.next_pos = 0  # the position the first draft would take

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        if self.inner is not None:
            self.inner.begin(prompt, params, rng)

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.commit(tokens, positions, hidden)
        self.next_pos = int(positions[-1]) + 2  # after the token that follows the last committed row

    def propose(self, n: int) -> Proposal:
        if self.inner is not None:
            n = len(self.inner.propose(n).tokens)
        i = self.next_pos - self.start
        toks = self.future[i : i + n]
        return Proposal([(t + 1) % 256 for t in toks] if self.wrong else toks, None)


def scripted(pair: Pair, future: list[int], start: int, wrong: bool = False, real: bool = True) -> Pair:
    """`pair` with its drafter wrapped in a Scripted one (`real`: the real drafter still runs)."""
    model, make = pair
    return model, lambda eng: Scripted(future, start, wrong, make(eng) if real else None)


def same_cache(a: Engine, b: Engine) -> bool:
    """K/V of every cached position and (hybrid caches) the conv and recurrent states, bit for bit."""
    ca: Any = a.cache
    cb: Any = b.cache
    n = ca.n
    kva, kvb = getattr(ca, "kv", ca), getattr(cb, "kv", cb)
    def rec(c: Any) -> list[np.ndarray]:  # a hybrid cache's states as of its last position (records applied)
        return [*getattr(c, "conv", []), *(c.states() if hasattr(c, "states") else [])]

    states = list(zip(rec(ca), rec(cb), strict=True))
    return n == cb.n and all(
        np.array_equal(x[:, :n], y[:, :n]) for x, y in zip(kva.k + kva.v, kvb.k + kvb.v, strict=True)
    ) and all(np.array_equal(x, y) for x, y in states)


def oracle_rounds(k: int, n_after_first: int) -> int:
    """Rounds that draft when every draft is accepted: each drafts min(k, remaining - 1) and emits drafts + 1."""
    rounds, rem = 0, n_after_first
    while rem > 0:
        n = min(k, rem - 1)
        rounds += n > 0
        rem -= n + 1
    return rounds


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df), integer df, in closed form (no scipy)."""
    h = x / 2.0
    if df % 2 == 0:
        return math.exp(-h) * sum(h**k / math.factorial(k) for k in range(df // 2))
    tail = sum(math.exp((k - 0.5) * math.log(h) - h - math.lgamma(k + 0.5)) for k in range(1, (df + 1) // 2))
    return math.erfc(math.sqrt(h)) + (tail if h > 0 else 0.0)
