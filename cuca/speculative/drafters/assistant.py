"""Drafting with a separate drafter network that reads the target (gemma4-assistant): each step feeds the last
token and a target-width hidden state at the first position not in the target's cache; the drafter keeps no cache
of its own, so nothing needs rolling back when drafts are rejected."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...sampling import SamplingParams, greedy_token, sample, to_probs
from ..proposal import Proposal


class AssistantDrafter:
    """Chains `assistant.step` n times from (history[-1], the target's post-norm hidden of the row that produced
    it, position len(history) - 1); later steps feed the previous draft and the drafter's own next hidden."""

    uses_hidden = True

    def __init__(self, assistant: Any, cache: Any):
        self.assistant, self.cache = assistant, cache
        self.params = SamplingParams()
        self.rng: np.random.Generator = np.random.default_rng(0)
        self.h: np.ndarray | None = None

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.params, self.rng, self.h = params, rng, None

    def observe(self, hidden: np.ndarray, positions: np.ndarray, next_tokens: list[int]) -> None:
        self.h = np.ascontiguousarray(hidden[-1:], np.float32)

    def propose(self, history: list[int], n: int) -> Proposal:
        pos = len(history) - 1
        if self.h is None or n < 1:
            return Proposal([], None)
        if self.cache.n != pos:
            raise RuntimeError(f"drafter out of step: target cache holds {self.cache.n} positions, expected {pos}")
        tok, h, tokens, qs = history[-1], self.h, [], []
        for _ in range(n):
            logits, h = self.assistant.step(np.array([tok], np.int32), h, pos, self.cache)
            if self.params.greedy:
                tok = greedy_token(logits[0])
            else:
                q = to_probs(logits[0], self.params)
                tok = sample(q, float(self.rng.random()))
                qs.append(q)
            tokens.append(tok)
        return Proposal(tokens, np.stack(qs) if qs else None)
