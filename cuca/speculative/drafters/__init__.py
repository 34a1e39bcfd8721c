"""Drafters propose tokens; the target verifies them. Each returns a Proposal(tokens, q_draft).

The round loop talks to every drafter through this protocol:
- `begin(prompt, params, rng)` at the start of a request (the prompt is then in the target's cache);
- `observe(hidden, positions, next_tokens)` after the prefill and after every verify round, with the target rows
  just committed (only for drafters with `uses_hidden`): `hidden` (R, n_embd) float32 post-output-norm states at
  `positions` (R,) int32, and `next_tokens[i]`, the token that follows row i (the bonus token for the last row);
- `propose(history, n)`: up to n drafts after `history` (prompt + emitted tokens; history[-1] is fed next and is
  not yet in the target's cache). Drafts are sampled from q_draft with the request's params and rng (arg-max at
  temperature 0, then q_draft may be None).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...sampling import SamplingParams
from ..proposal import Proposal


class Drafter(Protocol):
    uses_hidden: bool  # True: the loop runs the target through forward_hidden and calls observe()

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None: ...

    def observe(self, hidden: np.ndarray, positions: np.ndarray, next_tokens: list[int]) -> None: ...

    def propose(self, history: list[int], n: int) -> Proposal: ...
