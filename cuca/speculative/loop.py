"""The speculative round loop: draft -> one batched verify pass -> accept -> roll the cache back.

Each round feeds the last emitted (not yet cached) token plus the drafts at consecutive positions. Row i of the
verify pass predicts the token after draft i (row 0: after the fed token); with batch-invariant kernels those
rows equal what plain decoding computes, so greedy output is bit-identical to plain decoding. A round with no
drafts is exactly a plain decode step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..sampling import SamplingParams, greedy_token, to_probs
from .drafters import Drafter
from .governor import Governor
from .proposal import Proposal
from .stats import RequestDraftStats
from .verify import Verdict, verify, verify_greedy


def round_size(draft_tokens: int, remaining: int, pos: int, n_ctx: int, rollback_limit: int | None) -> int:
    """Drafts this round: fewer near max_tokens (a round emits drafts + 1), near the context end (drafts + the fed
    token must fit), and never past the target's rollback limit."""
    n = min(draft_tokens, remaining - 1, n_ctx - pos - 1)
    if rollback_limit is not None:
        n = min(n, rollback_limit)
    return max(n, 0)


def verify_round(
    model: Any,
    cache: Any,
    fed: int,
    drafts: list[int],
    pos: int,
    params: SamplingParams,
    rng: np.random.Generator,
    q_draft: np.ndarray | None,
    drafter: Drafter | None = None,
) -> Verdict:
    """One batched pass over [fed, *drafts] at positions pos.., then acceptance; the cache keeps the fed token
    and the accepted drafts only. A drafter that reads the target sees the committed rows' hidden states."""
    ids = np.array([fed, *drafts], np.int32)
    positions = np.arange(pos, pos + len(ids), dtype=np.int32)
    hidden = None
    if drafter is not None and drafter.uses_hidden:
        hidden = model.forward_hidden(ids, positions, cache)
        logits = model.head(hidden)
    else:
        logits = model.forward(ids, positions, cache, "all")
    if params.greedy:
        verdict = verify_greedy([greedy_token(row) for row in logits], drafts)
    else:
        p_target = np.stack([to_probs(row, params) for row in logits])
        uniforms = rng.random(2 * len(ids))  # a fixed count per round keeps seeded runs reproducible
        verdict = verify(p_target, Proposal(drafts, q_draft), uniforms)
    cache.trim(len(drafts) - verdict.n_accepted)
    if hidden is not None and drafter is not None:
        m = verdict.n_accepted + 1
        drafter.observe(hidden[:m], positions[:m], verdict.tokens)
    return verdict


def speculative_tokens(
    model: Any,
    cache: Any,
    first: int,
    prompt: list[int],
    max_tokens: int,
    params: SamplingParams,
    rng: np.random.Generator,
    drafter: Drafter,
    draft_tokens: int,
    governor: Governor,
    stats: RequestDraftStats,
    rollback_limit: int | None = None,
    prefill_hidden: np.ndarray | None = None,
) -> Iterator[int]:
    """Yield the tokens after `first` (already emitted, not yet cached), round by round, until max_tokens in
    all (counting `first`); the caller stops iterating at a stop token, so nothing after it is committed.
    `prefill_hidden` (len(prompt), n_embd): the prompt rows' post-norm states, for drafters that read them."""
    history = [*prompt, first]
    drafter.begin(prompt, params, rng)
    if drafter.uses_hidden:
        if prefill_hidden is None:
            raise ValueError("this drafter reads the target's hidden states: pass prefill_hidden")
        drafter.observe(prefill_hidden, np.arange(len(prompt), dtype=np.int32), [*prompt[1:], first])
    fed, pos, n_ctx = first, len(prompt), cache.n_ctx
    force = params.seed is not None and not params.greedy
    mark = governor.event_count
    try:
        while True:
            remaining = max_tokens - (len(history) - len(prompt))
            if remaining <= 0:
                return
            n = round_size(draft_tokens, remaining, pos, n_ctx, rollback_limit)
            drafting = n > 0 and governor.decide(force)
            t0 = time.perf_counter()
            proposal = drafter.propose(history, n) if drafting else None
            drafts = list(proposal.tokens[:n]) if proposal is not None else []
            q = None if proposal is None or proposal.q_draft is None else proposal.q_draft[: len(drafts)]
            verdict = verify_round(model, cache, fed, drafts, pos, params, rng, q, drafter)
            governor.record(bool(drafts), len(verdict.tokens), time.perf_counter() - t0)
            if drafts:
                stats.record_round(len(drafts), verdict.n_accepted)
            for tok in verdict.tokens:
                history.append(tok)
                yield tok
            pos += 1 + verdict.n_accepted
            fed = verdict.tokens[-1]
    finally:  # also when the caller stops at a stop token
        stats.governor_events += governor.events_since(mark)
