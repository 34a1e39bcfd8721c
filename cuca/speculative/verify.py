"""The acceptance rule of speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

Draft x_i (drawn from q_i) is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection one
token is drawn from norm(max(0, p_i - q_i)) and the round ends; if every draft is accepted a bonus token is drawn
from p_{n}. Each emitted token is then distributed exactly as p, whatever q is. With a one-hot (greedy) p, a draft
is accepted iff it is the arg-max, and the token that ends the round is the arg-max.

Uniforms are passed in, so `verify` is pure. Two layouts are accepted, for n drafts:
  * n + 1 values: u[i] is the coin of draft i, u[n] the draw of the token that ends the round;
  * 2 (n + 1) values, a (coin, draw) pair per position: u[2i] is the coin of draft i, u[2k + 1] the draw of the
    token that ends the round at position k (u[2n] is unused).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sampling import sample
from .proposal import Proposal


@dataclass(frozen=True)
class Verdict:
    """`tokens` is the accepted drafts plus one token: the correction at the first rejection, or the bonus."""

    n_accepted: int
    tokens: list[int]


def accepts(p: np.ndarray, q: np.ndarray | None, x: int, u: float) -> bool:
    """Whether draft x passes its coin u in [0, 1): u < min(1, p[x] / q[x]); q None is one-hot at x."""
    p_x = float(p[x])
    if p_x <= 0.0:  # also the whole greedy rule: a one-hot p has p[x] 0 or 1
        return False
    q_x = 1.0 if q is None else float(q[x])
    # min() keeps float fuzz in q (q[x] a hair above 1) from ever rejecting the one token of a one-hot p
    return p_x >= min(q_x, 1.0) or u < p_x / q_x


def residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """norm(max(0, p - q)), the distribution a rejected draft x is replaced from; q None is one-hot at x, which
    leaves p with x removed. An all-zero residual (possible only by float error) falls back to p."""
    if q is None:
        r = p.copy()
        r[x] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0.0 else p


def _split_uniforms(uniforms: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(coins, draws): coins[i] tests draft i, draws[k] draws the token that ends the round at position k."""
    u = np.asarray(uniforms, np.float64).reshape(-1)
    if u.shape[0] == n + 1:
        return u[:n], np.full(n + 1, u[n])
    if u.shape[0] == 2 * (n + 1):
        return u[0::2], u[1::2]
    raise ValueError(f"need {n + 1} or {2 * (n + 1)} uniforms for {n} drafts, got {u.shape[0]}")


def verify(p_target: np.ndarray, proposal: Proposal, uniforms: np.ndarray) -> Verdict:
    """Accept a prefix of the drafts and emit one more token.

    Args:
        p_target: float64 (n_drafts + 1, n_vocab); row i is the target's distribution (from `to_probs`) at the
            position of draft i, the last row the one after the last draft.
        proposal: the drafts and the distributions q_draft they were drawn from (None: deterministic drafter).
        uniforms: n_drafts + 1 or 2 (n_drafts + 1) values in [0, 1), laid out as the module docstring says.
    """
    drafts, q_draft = proposal.tokens, proposal.q_draft
    n = len(drafts)
    if p_target.ndim != 2 or p_target.shape[0] != n + 1:
        raise ValueError(f"p_target must have shape ({n + 1}, n_vocab) for {n} drafts, got {p_target.shape}")
    n_vocab = p_target.shape[1]
    if q_draft is not None and q_draft.shape != (n, n_vocab):
        raise ValueError(f"q_draft must have shape ({n}, {n_vocab}), got {q_draft.shape}")
    if any(not 0 <= x < n_vocab for x in drafts):
        raise ValueError(f"draft ids must be in [0, {n_vocab}), got {drafts}")
    coins, draws = _split_uniforms(uniforms, n)
    for i, x in enumerate(drafts):
        q = None if q_draft is None else q_draft[i]
        if not accepts(p_target[i], q, x, float(coins[i])):
            return Verdict(i, [*map(int, drafts[:i]), sample(residual(p_target[i], q, x), float(draws[i]))])
    return Verdict(n, [*map(int, drafts), sample(p_target[n], float(draws[n]))])


def verify_greedy(target_argmax: list[int], drafts: list[int]) -> Verdict:
    """The temperature-0 rule without distributions: accept drafts while they equal the target's arg-max tokens
    (target_argmax[i] at the position of draft i, one more after the last), then emit the target's token."""
    if len(target_argmax) != len(drafts) + 1:
        raise ValueError(f"need {len(drafts) + 1} target tokens for {len(drafts)} drafts, got {len(target_argmax)}")
    k = 0
    while k < len(drafts) and drafts[k] == target_argmax[k]:
        k += 1
    return Verdict(k, [*drafts[:k], target_argmax[k]])
