"""Drafting with a small model of the target's family (Qwen3-0.6B for Qwen3-8B): an ordinary model file with its own
cache, run through the same Ops (kernels, threads) as the target.

The drafter keeps the committed text (`history`, position by position; its last token is the one the target is fed
next) and the tokens its own cache holds. A proposal first catches up: the committed tokens its cache lacks go
through the draft model in one batched pass (after the round's accepted drafts that is 1-2 tokens), after rolling
its cache back to the longest prefix it shares with the history (rejected drafts, the last draft it never fed). Then
it drafts n tokens one at a time: the arg-max at temperature 0, else a draw from q = `to_probs` of its logits with the
request's temperature/top_k/top_p, which verification needs to keep min(1, p/q) exact. A cache that rolls back only
a bounded depth (the qwen35 hybrid) is snapshotted after each catch-up and restored before the next one instead.

Vocabularies may differ in size by up to 128 ids (llama.cpp's rule, see pairing.py): the drafter's logits are cut
or padded (with -inf) to the target's width, so q never proposes an id the target cannot score.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...sampling import SamplingParams, greedy_token, sample, to_probs
from ..proposal import Proposal

# While the governor keeps drafting off, committed tokens queue up; past this many they go through the draft model
# in one batch (the catch-up at the next proposal then stays short).
FLUSH_ROWS = 64


class DraftModelDrafter:
    """Drafts with `model` (a cuca Model), owning a cache of `n_ctx` positions; `n_vocab` is the target's logit
    width (the width of every q_draft row)."""

    def __init__(self, model: Any, n_ctx: int, n_vocab: int):
        self.model, self.n_vocab = model, n_vocab
        self.cache = model.make_cache(n_ctx)
        self.bounded = self.cache.max_rollback is not None  # snapshot instead of trimming
        self.params = SamplingParams()
        self.rng = np.random.default_rng(0)
        self.history: list[int] = []  # committed tokens, history[p] at position p; the last one is not in the target
        self.cached: list[int] = []  # the tokens whose rows the drafter's cache holds, positions 0..
        self._sure = 0  # cached[:_sure] == history[:_sure] (known without comparing)
        # the draft model's logits after history[: len(cached)], or on a device model at temperature 0 their arg-max
        self._logits: np.ndarray | int | None = None
        self._snap: Any = None  # bounded caches: the state after the last catch-up (cached == history then)

    def for_cache(self, cache: Any) -> DraftModelDrafter:
        """Another instance (its own cache) sharing the draft model, for another target cache: a batcher's lane."""
        return DraftModelDrafter(self.model, cache.n_ctx, self.n_vocab)

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.cache.reset()
        self.params, self.rng = params, rng
        self.history = list(prompt[:1])  # commits bring the tokens that follow each row, from position 1 on
        self.cached, self._sure, self._logits, self._snap = [], 0, None, None

    def resume(self, prompt: list[int], keep: int, params: SamplingParams, rng: np.random.Generator) -> int:
        """Begin on `prompt` whose first `keep` rows the target kept (prompt cache): the own cache's rows stay, and
        the next catch-up keeps those whose tokens match the new history. A cache that rolls back only a bounded
        depth (snapshots) cannot be rewound to an arbitrary prefix: 0, a cold start."""
        if self.bounded:
            return 0
        self.params, self.rng = params, rng
        self.history = list(prompt[: keep + 1])
        self._sure, self._logits, self._snap = 0, None, None  # catch-up compares what its cache holds
        return keep

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray | None = None) -> None:
        if len(positions) and int(positions[0]) + 1 != len(self.history):
            raise ValueError(f"commit at position {int(positions[0])} does not continue the {len(self.history)} "
                             f"tokens held")
        self.history += tokens
        if len(self.history) - self._sure >= FLUSH_ROWS:
            self._catch_up()

    def _catch_up(self) -> None:
        """Make the cache hold exactly the history, with one batched pass over the tokens it lacks."""
        h, c = self.history, self.cached
        fresh = self._sure == len(h) and self._logits is not None  # nothing committed since the last catch-up
        if self.bounded:
            if self._snap is not None:  # back to the state after the last catch-up, a prefix of the history
                self.cache.restore(self._snap)
                del c[self._sure :]
            keep = len(c)
        else:
            keep = self._sure
            while keep < min(len(c), len(h)) and c[keep] == h[keep]:
                keep += 1
            self.cache.trim(self.cache.n - keep)
            del c[keep:]
        if keep < len(h) or not fresh:
            keep = min(keep, len(h) - 1)  # logits are needed after the last token: feed at least it
            if self.cache.n > keep:
                self.cache.trim(self.cache.n - keep)
                del c[keep:]
            ids = np.array(h[keep:], np.int32)
            hid = self.model.forward_hidden(ids, np.arange(keep, len(h), dtype=np.int32), self.cache)
            self._logits = (int(self.model.argmax(hid)[-1]) if self._on_device() else
                            self.model.head(np.ascontiguousarray(hid[-1:]))[0])
            c += h[keep:]
        self._sure = len(h)
        if self.bounded:
            self._snap = self.cache.snapshot()

    def _on_device(self) -> bool:
        """Greedy on a device model (`argmax`: only ids come back) whose ids the target can all score."""
        return self.params.greedy and hasattr(type(self.model), "argmax") and int(self.model.n_vocab) <= self.n_vocab

    def _aligned(self, logits: np.ndarray) -> np.ndarray:
        """The draft logits over the target's ids: cut, or padded with -inf."""
        n = self.n_vocab
        if logits.shape[0] == n:
            return logits
        if logits.shape[0] > n:
            return logits[:n]
        out = np.full(n, -np.inf, np.float32)
        out[: logits.shape[0]] = logits
        return out

    def _pick(self, logits: np.ndarray | int) -> tuple[int, np.ndarray | None]:
        if isinstance(logits, int):  # the arg-max, taken on the device
            return logits, None
        z = self._aligned(logits)
        if self.params.greedy:
            return greedy_token(z), None
        q = to_probs(z, self.params)
        return sample(q, float(self.rng.random())), q

    def propose(self, n: int) -> Proposal:
        if n < 1 or not self.history:
            return Proposal([], None)
        self._catch_up()
        assert self._logits is not None
        logits, pos = self._logits, len(self.history)
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        for i in range(n):
            tok, q = self._pick(logits)
            drafts.append(tok)
            if q is not None:
                qs.append(q)
            if i + 1 < n:  # the last draft is not fed: the next catch-up feeds what the target emits instead
                ids, at = np.array([tok], np.int32), np.array([pos], np.int32)
                if self._on_device():
                    logits = int(self.model.argmax(self.model.forward_hidden(ids, at, self.cache))[0])
                else:
                    logits = self.model.forward(ids, at, self.cache)[0]
                self.cached.append(tok)
                pos += 1
        return Proposal(drafts, np.stack(qs) if qs else None)
