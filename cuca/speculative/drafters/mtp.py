"""The in-trunk drafter: the MTP ("nextn") block inside a Qwen 3.5 GGUF proposes tokens from the target's own
post-norm hidden states.

Pairing (the spec's vLLM convention): the head's K/V slot at position p holds the pair (x_{p+1}, h_p), the token
that followed position p with the target's hidden state at p. `commit` queues those pairs for the rows the target
just committed; before the next draft they go through the head in one batched pass (first trimming what the head
wrote past them: chained drafts, or rejected rows), and the head's output for the last row ranks the first draft.
Draft i+1 chains the head's own output for draft i, one position further. Draft steps rank only the first
`draft_vocab` token ids (65,536 of Qwen 3.5's 248,320), which is several times cheaper than the full head; the
target still scores the whole vocabulary.

Coarse ranking (`coarse`, the C backend's default): a draft step reads a Q4_0 copy of those head rows (38 MB for
Qwen 3.5 0.8B's Q8_0 head instead of 71 MB) and, for a greedy draft, rescores the RESCORE best of them with the head
itself, so the draft is the head's own arg-max wherever that is among them (only near-ties could put it outside).
A sampled draft is drawn from the coarse logits, and its q_draft is that distribution (the verification stays
exact for any q). Qwen 3.5 0.8B real-shape file, controlled acceptance at the published level, 5 interleaved
plain / speculative pairs per setting in one process (AVX-512, 2 threads, cuca vs cuca; benchmarks/bench_mtp_coarse.py):
drafting every round 1.533x -> 1.666x plain and governed 1.542x -> 1.722x in one run, 1.581x -> 1.640x and
1.455x -> 1.572x in another (medians; single requests spread over 1.3-1.8x).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError, ProviderError
from ...models.layers import RESCORE  # coarse candidates a greedy draft rescores with the head itself
from ...sampling import SamplingParams, greedy_token, sample, to_probs, top_ids
from ..proposal import Proposal

DRAFT_VOCAB = 65536
# Committed rows wait until the next draft (or this many rows) and then go through the head in one batched pass
# that computes only their K/V (and the last row's output): while the governor keeps drafting off, keeping the
# head level costs its eh_proj and K/V projections per token.
FLUSH_ROWS = 64


class MTPDrafter:
    """Drafts with the target's MTP head; owns the head's K/V cache of n_ctx positions. A target without a head
    is a ProviderError naming `path` (its file)."""

    def __init__(self, model: Any, n_ctx: int, draft_vocab: int = DRAFT_VOCAB, path: object = "",
                 coarse: bool | None = None):
        if getattr(model, "mtp", None) is None:
            where = path or getattr(model, "path", None) or f"this {getattr(model, 'arch', 'model')} file"
            raise ProviderError(
                f"drafter: {where} has no prediction head (architecture {getattr(model, 'arch', '?')!r}, no "
                f"nextn/MTP block); the in-trunk drafter needs a file with MTP/nextn tensors, e.g. qwen35 with "
                f"blk.N.nextn.*"
            )
        if draft_vocab < 1:
            raise ConfigError(f"draft_vocab must be >= 1, got {draft_vocab!r}")
        self.model = model
        self.cache = model.make_mtp_cache(n_ctx)
        self.n_rank = min(draft_vocab, model.n_vocab)
        if coarse is None:
            coarse = bool(getattr(getattr(model, "ops", None), "coarse_draft_heads", False))
        # the Q4_0 copy is made here, once per model (later drafters share it), not on the first draft
        self.coarse = coarse and model.mtp.coarse_rows(self.n_rank) is not None
        self.params = SamplingParams()
        self.rng = np.random.default_rng(0)
        self._h: np.ndarray | None = None  # head output for the last committed row, (1, n_embd)
        self._pos = -1  # that row's position
        self._pending: list[tuple[np.ndarray, np.ndarray, list[int]]] = []  # committed rows not yet through the head
        self._ids: list[int] = []  # the tokens its committed rows pair with: _ids[p + 1] follows row p

    def for_cache(self, cache: Any) -> MTPDrafter:
        """Another instance (its own head cache) for another target cache of the same model: a batcher's lane."""
        return MTPDrafter(self.model, cache.n_ctx, self.n_rank, coarse=self.coarse)

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.cache.reset()
        self.params, self.rng = params, rng
        self._h, self._pos = None, -1
        self._pending.clear()
        self._ids = list(prompt[:1])

    def resume(self, prompt: list[int], keep: int, params: SamplingParams, rng: np.random.Generator) -> int:
        """Begin on `prompt` whose first `keep` rows the target kept (prompt cache), keeping the head's own K/V for
        as many of them as pair with the same tokens (row p pairs with token p + 1); returns that many."""
        self.flush()
        same = 0
        n = min(len(self._ids), len(prompt))
        while same < n and self._ids[same] == prompt[same]:
            same += 1
        r = max(0, min(keep, self.cache.n, same - 1))
        self.cache.trim(self.cache.n - r)
        self.params, self.rng = params, rng
        self._h, self._pos = None, r - 1
        self._ids = list(prompt[: r + 1])
        return r

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray) -> None:
        if len(tokens) == 0:
            return
        del self._ids[int(positions[0]) + 1 :]
        self._ids.extend(int(t) for t in tokens)
        self._pending.append((np.array(hidden, np.float32), np.array(positions, np.int32), list(tokens)))
        self._pos = int(positions[-1])
        if sum(len(t) for _, _, t in self._pending) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Run the pending rows through the head in one pass (batch-invariant kernels: the same K/V and outputs as
        row by row); first drop what the head wrote at or past them (chained drafts, rejected rows)."""
        if not self._pending:
            return
        hidden = np.concatenate([h for h, _, _ in self._pending])
        positions = np.concatenate([p for _, p, _ in self._pending])
        toks = np.array([t for _, _, ts in self._pending for t in ts], np.int32)
        self._pending.clear()
        p0 = int(positions[0])
        if p0 > self.cache.n:
            raise ValueError(f"the drafter holds {self.cache.n} positions and cannot skip to position {p0}")
        self.cache.trim(self.cache.n - p0)
        out = self.model.mtp_forward(toks, hidden, positions, self.cache, last_only=True)
        self._h = np.ascontiguousarray(out[-1:])

    def _draft(self, h: np.ndarray) -> tuple[int, np.ndarray | None]:
        """The next draft from the head output h (1, n_embd), and its q_draft (None when greedy)."""
        if not self.coarse:
            return self._pick(self.model.mtp_logits(h, self.n_rank)[0])
        logits = self.model.mtp_logits(h, self.n_rank, coarse=True)[0]
        if not self.params.greedy or logits.shape[0] <= RESCORE:
            return self._pick(logits)
        ids = top_ids(logits[None], RESCORE)[0]
        return int(ids[greedy_token(self.model.mtp_logits_of(h, ids))]), None  # ties: the lowest id, as argmax

    def _pick(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        if self.params.greedy:
            return greedy_token(logits), None
        full = np.full(self.model.n_vocab, -np.inf, np.float32)
        full[: logits.shape[0]] = logits
        q = to_probs(full, self.params)
        return sample(q, float(self.rng.random())), q

    def propose(self, n: int) -> Proposal:
        if n > 0:
            self.flush()
        if n <= 0 or self._h is None:
            return Proposal([], None)
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        h, pos = self._h, self._pos + 1
        self.cache.trim(max(self.cache.n - pos, 0))  # a previous propose may have chained past this point
        for i in range(n):
            tok, q = self._draft(h)
            drafts.append(tok)
            if q is not None:
                qs.append(q)
            if i + 1 < n:
                h = self.model.mtp_forward(np.array([tok], np.int32), h, np.array([pos], np.int32), self.cache)
                pos += 1
        return Proposal(drafts, np.stack(qs) if qs else None)
