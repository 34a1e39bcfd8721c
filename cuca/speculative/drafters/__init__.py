"""Drafters propose tokens; the target verifies them. Each returns a Proposal(tokens, q_draft).

The SpeculativeDecoder talks to every drafter through this protocol:
- `begin(prompt, params, rng)` at the start of a request, before the prompt goes through the target;
- `commit(tokens, positions, hidden)` whenever the target commits rows to its cache: the prompt's (in chunks) and,
  after every verify round, the fed token's and the accepted drafts' rows. `positions` (R,) int32 are the rows'
  positions, consecutive and continuing the previous commit; `hidden` (R, n_embd) float32 their post-output-norm
  states; `tokens[i]` is the token that follows row i, at position positions[i] + 1 (for the last row, the token
  fed next, not yet in the target's cache). Rejected drafts are never committed;
- `propose(n)`: up to n drafts after the last committed token. Drafts are sampled from q_draft with the request's
  params and rng (arg-max at temperature 0, then q_draft may be None).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...sampling import SamplingParams
from ..proposal import Proposal


class Drafter(Protocol):
    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None: ...

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray) -> None: ...

    def propose(self, n: int) -> Proposal: ...
