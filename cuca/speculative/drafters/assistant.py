"""Drafting with a separate drafter network that reads the target (gemma4-assistant): each step feeds the last
token and a target-width hidden state at the first position not in the target's cache; the drafter keeps no cache
of its own, so nothing needs rolling back when drafts are rejected."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...sampling import SamplingParams, greedy_token, sample, to_probs
from ..proposal import Proposal


class AssistantDrafter:
    """Chains `assistant.step` n times from (the last committed token, the target's post-norm hidden of the row
    that produced it, the position that token takes); later steps feed the previous draft and the drafter's own
    next hidden."""

    def __init__(self, assistant: Any, cache: Any):
        self.assistant, self.cache = assistant, cache
        self.params = SamplingParams()
        self.rng: np.random.Generator = np.random.default_rng(0)
        self.h: np.ndarray | None = None  # (1, n_embd) the target's hidden state of the last committed row
        self.tok, self.pos = -1, -1  # the token that follows it, and that token's position

    def for_cache(self, cache: Any) -> AssistantDrafter:
        """Another instance on another target cache (a batcher's lane), sharing the drafter's weights."""
        return AssistantDrafter(self.assistant, cache)

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.params, self.rng, self.h = params, rng, None

    def resume(self, prompt: list[int], keep: int, params: SamplingParams, rng: np.random.Generator) -> int:
        """Begin on a prompt whose first `keep` rows the target kept (prompt cache): the drafter reads the target's
        own K/V and keeps nothing else, so every kept row is fine."""
        self.begin(prompt, params, rng)
        return keep

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray) -> None:
        self.h = np.ascontiguousarray(hidden[-1:], np.float32)
        self.tok, self.pos = int(tokens[-1]), int(positions[-1]) + 1

    def propose(self, n: int) -> Proposal:
        if self.h is None or n < 1:
            return Proposal([], None)
        pos = self.pos
        if self.cache.n != pos:
            raise RuntimeError(f"drafter out of step: target cache holds {self.cache.n} positions, expected {pos}")
        chain = getattr(self.assistant, "draft_greedy", None)
        if self.params.greedy and chain is not None:  # a device model chains the steps there: one copy back
            return Proposal(chain(self.tok, self.h, pos, self.cache, n), None)
        tok, h, tokens, qs = self.tok, self.h, [], []
        for _ in range(n):
            logits, h = self.assistant.step(np.array([tok], np.int32), h, pos, self.cache, greedy=self.params.greedy)
            if self.params.greedy:
                tok = greedy_token(logits[0])
            else:
                q = to_probs(logits[0], self.params)
                tok = sample(q, float(self.rng.random()))
                qs.append(q)
            tokens.append(tok)
        return Proposal(tokens, np.stack(qs) if qs else None)
