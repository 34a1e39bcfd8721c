"""What a drafter hands to verification: the drafted tokens and the distributions they were drawn from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Proposal:
    """`q_draft` is float64 (len(tokens), n_vocab), row i the distribution token i was sampled from (after the
    drafter's temperature, top_k and top_p). None marks a deterministic drafter (prompt lookup, arg-max drafting):
    verification then treats q as one-hot at each drafted token."""

    tokens: list[int]
    q_draft: np.ndarray | None = None

    def __post_init__(self) -> None:
        q = self.q_draft
        if q is not None and (q.ndim != 2 or q.shape[0] != len(self.tokens)):
            raise ValueError(f"q_draft must have shape ({len(self.tokens)}, n_vocab), got {q.shape}")
