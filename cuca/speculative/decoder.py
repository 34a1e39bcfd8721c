"""SpeculativeDecoder: draft -> one batched verify pass -> accept -> roll the cache back, round by round.

Each round feeds the last emitted (not yet cached) token plus the drafts at consecutive positions. Row i of the
verify pass predicts the token after draft i (row 0: after the fed token); with batch-invariant kernels those
rows equal what plain decoding computes, so greedy output is bit-identical to plain decoding. A round with no
drafts is exactly a plain decode step. The target always runs `forward_hidden` then `head`, and the drafter gets
every row the target commits (the prompt's included) through one `commit(tokens, positions, hidden)` call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from ..engine import greedy_rows, prefill_rows
from ..errors import ConfigError
from ..models import Model
from ..models.cache import Cache
from ..sampling import SamplingParams, next_token, to_probs
from .drafters import Drafter
from .governor import Governor
from .proposal import Proposal
from .stats import RequestDraftStats
from .verify import Verdict, verify, verify_greedy


def round_size(draft_tokens: int, remaining: int, pos: int, cache: Cache) -> int:
    """The most drafts this round has room for (the governor picks how many, 0..this): draft_tokens, fewer near
    max_tokens (a round emits drafts + 1), near the context end (drafts + the fed token must fit), and never more
    than the cache can roll back."""
    n = min(draft_tokens, remaining - 1, cache.n_ctx - pos - 1)
    if cache.max_rollback is not None:
        n = min(n, cache.max_rollback)
    return max(n, 0)


class SpeculativeDecoder:
    """One request's speculative decoding on `model` and its `cache`: each round `governor` picks how many drafts
    (0..draft_tokens, 0 being a plain step) and `drafter` proposes them; `stats` collects the request's drafting.
    `clock` (seconds) times the rounds for the governor."""

    def __init__(self, model: Model, cache: Cache, drafter: Drafter, governor: Governor, draft_tokens: int = 3):
        if not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise ConfigError(f"draft_tokens must be an integer >= 1, got {draft_tokens!r}")
        self.model, self.cache, self.drafter, self.governor = model, cache, drafter, governor
        self.draft_tokens = draft_tokens
        self.stats = RequestDraftStats()
        self.clock: Callable[[], float] = time.perf_counter

    def resume(self, prompt: list[int], keep: int, params: SamplingParams, rng: np.random.Generator) -> int:
        """The prompt cache offers `keep` rows of `prompt` already in the target's cache: the drafter resumes on as
        many of them as its own state agrees with (0 when it cannot resume: a cold start)."""
        fn = getattr(self.drafter, "resume", None)
        return int(fn(prompt, keep, params, rng)) if fn is not None and keep > 0 else 0

    def generate(self, prompt: list[int], max_tokens: int, params: SamplingParams, rng: np.random.Generator,
                 start: int = 0) -> Iterator[int]:
        """Prefill `prompt` (the cache holds its first `start` rows, and the drafter was resumed on them; 0: the
        cache is empty), then yield max_tokens tokens, the first from the prefill; the caller may stop iterating at
        a stop token: nothing after it is committed."""
        fed, pos, emitted = self._prefill(prompt, params, rng, start), len(prompt), 1
        yield fed
        force = params.seed is not None and not params.greedy  # seeded sampling drafts every round: reproducible
        mark = self.governor.event_count
        begin = getattr(self.governor, "begin_request", None)  # optional: a batcher's lanes share their decisions
        if begin is not None:
            begin()
        try:
            while emitted < max_tokens:
                limit = round_size(self.draft_tokens, max_tokens - emitted, pos, self.cache)
                t0 = self.clock()
                depth = min(max(self.governor.decide(limit, force), 0), limit) if limit > 0 else 0
                proposal = _first(self.drafter.propose(depth), depth) if depth > 0 else Proposal([])
                verdict = self._verify(fed, pos, proposal, params, rng)
                # the drafts proposed, not asked for: a lookup that found nothing ran a plain step
                self.governor.record(len(proposal.tokens), verdict.n_accepted, self.clock() - t0)
                self.stats.record_depth(depth)
                if proposal.tokens:
                    self.stats.record_round(len(proposal.tokens), verdict.n_accepted)
                yield from verdict.tokens
                emitted += len(verdict.tokens)
                pos += 1 + verdict.n_accepted
                fed = verdict.tokens[-1]
        finally:  # also when the caller stops at a stop token
            self.stats.governor_events += self.governor.events_since(mark)

    def _prefill(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator, start: int) -> int:
        """The prompt (from row `start`) through the target, its rows committed to the drafter; returns the first
        token."""
        if start == 0:
            self.drafter.begin(prompt, params, rng)
        last: tuple[np.ndarray, np.ndarray] | None = None
        for rows in prefill_rows(self.model, self.cache, prompt[start:]):
            if last is not None:  # row p is followed by prompt[p + 1]
                self.drafter.commit(prompt[int(last[0][0]) + 1 : int(last[0][-1]) + 2], *last)
            last = rows
        if last is None:
            raise ConfigError("the prompt is empty: at least one token is needed")
        positions, hidden = last
        first = next_token(self.model.head(np.ascontiguousarray(hidden[-1:]))[0], params, rng)
        self.drafter.commit([*prompt[int(positions[0]) + 1 :], first], positions, hidden)
        return first

    def _verify(self, fed: int, pos: int, proposal: Proposal, params: SamplingParams,
                rng: np.random.Generator) -> Verdict:
        """One batched pass over [fed, *drafts] at positions pos.., then acceptance; the cache keeps the fed token
        and the accepted drafts only, and the drafter sees those rows."""
        ids = np.array([fed, *proposal.tokens], np.int32)
        positions = np.arange(pos, pos + len(ids), dtype=np.int32)
        hidden = self.model.forward_hidden(ids, positions, self.cache)
        if params.greedy:  # the arg-max on the model's device when it has one: no logits copied
            verdict = verify_greedy(greedy_rows(self.model, hidden), proposal.tokens)
        else:
            p_target = np.stack([to_probs(row, params) for row in self.model.head(hidden)])
            verdict = verify(p_target, proposal, rng.random(2 * len(ids)))  # a fixed count per round: reproducible
        self.cache.trim(len(proposal.tokens) - verdict.n_accepted)
        m = verdict.n_accepted + 1
        self.drafter.commit(verdict.tokens, positions[:m], hidden[:m])
        return verdict


def _first(p: Proposal, n: int) -> Proposal:
    """The proposal's first n drafts (a drafter may offer more than the round has room for)."""
    if len(p.tokens) <= n:
        return p
    return Proposal(list(p.tokens[:n]), None if p.q_draft is None else p.q_draft[:n])
