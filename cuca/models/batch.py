"""Several sequences in one forward pass: each brings its rows (tokens at contiguous positions) and its own cache;
the matmuls see all rows, attention and recurrent state are per sequence. One request's plain or speculative
decoding is the one-sequence case (`forward_hidden`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SeqRows:
    """One sequence's rows in a pass: tokens, positions int32 (M,) (one ascending run), and its cache."""

    tokens: np.ndarray
    positions: np.ndarray
    cache: Any


@dataclass(frozen=True)
class Seq:
    """A sequence's place in a batch: its row slice and where its positions start and end."""

    rows: slice
    positions: np.ndarray
    cache: Any

    @property
    def m(self) -> int:
        return self.rows.stop - self.rows.start

    @property
    def pos0(self) -> int:
        return int(self.positions[0])


class Batch:
    """The rows of one pass: tokens and positions of every sequence, concatenated in order."""

    def __init__(self, seqs: Sequence[SeqRows]):
        if not seqs:
            raise ValueError("a forward pass needs at least one sequence")
        if len({id(s.cache) for s in seqs}) != len(seqs):
            raise ValueError("two sequences of one pass share a cache")
        self.seqs: list[Seq] = []
        r0 = 0
        for s in seqs:
            m = int(s.tokens.shape[0])
            if m < 1 or s.positions.shape != (m,):
                raise ValueError(f"a sequence needs >= 1 token and one position per token, got {m} and "
                                 f"{s.positions.shape}")
            self.seqs.append(Seq(slice(r0, r0 + m), s.positions, s.cache))
            r0 += m
        one = len(seqs) == 1
        self.tokens = seqs[0].tokens if one else np.concatenate([s.tokens for s in seqs]).astype(np.int32)
        self.positions = seqs[0].positions if one else np.concatenate([s.positions for s in seqs]).astype(np.int32)
        self.n = r0


class Decoder:
    """What every architecture's Model shares: `forward`, `forward_hidden` and `forward_batch` on top of its own
    `run(batch) -> post-norm hidden` and `head(h) -> logits`, computed with its `ops`."""

    ops: Any

    def run(self, batch: Batch) -> np.ndarray:
        raise NotImplementedError

    def head(self, h: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def forward_batch(self, seqs: Sequence[SeqRows]) -> np.ndarray:
        """Rows of one or more sequences -> hidden states after the final norm, (sum M, n_embd), in `seqs` order;
        each row equals that sequence run alone, bit for bit."""
        batch = Batch(seqs)
        for s in batch.seqs:
            s.cache.check_room(s.pos0, s.m)
        h = self.run(batch)
        for s in batch.seqs:
            s.cache.advance(int(s.positions[-1]) + 1)
        return h

    def forward_hidden(self, tokens: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        """tokens, positions: int32 (M,) -> hidden states after the final norm, float32 (M, n_embd)."""
        return self.forward_batch([SeqRows(tokens, positions, cache)])

    def forward(self, tokens: np.ndarray, positions: np.ndarray, cache: Any, logits: str = "last") -> np.ndarray:
        """tokens, positions: int32 (M,) -> logits float32 (M, n_vocab) for "all", (1, n_vocab) for "last"."""
        h = self.forward_hidden(tokens, positions, cache)
        if logits == "last":
            h = self.ops.contiguous(h[-1:])
        elif logits != "all":
            raise ValueError(f"logits must be 'last' or 'all', got {logits!r}")
        return self.head(h)
