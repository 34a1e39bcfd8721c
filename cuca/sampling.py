"""Logits -> distribution -> token. One pipeline (temperature, then top_k, then top_p) serves both the target's
p and a drafter's q; random numbers are passed in, so every function here is pure and testable."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


def is_int(v: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_real(v: object) -> bool:
    """A real number (Python or numpy int or float), not a bool."""
    return is_int(v) or isinstance(v, (float, np.floating))


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0.0 is greedy; top_k 0 and top_p 1.0 disable those filters; seed None draws a fresh seed."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (is_real(self.temperature) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise ConfigError(f"seed must be a non-negative integer or None, got {self.seed!r}")
        # numpy scalars become Python numbers, so equal parameters compare and hash equal
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "seed", None if self.seed is None else int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def greedy_token(logits: np.ndarray) -> int:
    """The arg-max; on ties, the lowest id."""
    return int(np.argmax(logits))


TOP_CHUNK = 1024  # top_ids: values per chunk whose maximum stands for it (numpy's max over 1024: 38 us / 262,144)


def top_ids(x: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest values of each row of x (M, n), ascending per row, (M, k) int32 (ties: any of the
    tied ids). The k largest lie in the k chunks of TOP_CHUNK values with the largest maxima, so one pass takes the
    chunk maxima and a selection runs over k chunks only: k = 8 of 262,144 values in 62 us, np.argpartition 359 us."""
    m, n = x.shape
    c = TOP_CHUNK
    if k <= 0 or k >= n:
        return np.tile(np.arange(min(max(k, 0), n), dtype=np.int32), (m, 1))
    if n % c or n < 4 * k * c:
        return np.sort(np.argpartition(x, -k, axis=1)[:, -k:], axis=1).astype(np.int32)
    blocks = x.reshape(m, n // c, c)
    top = np.argpartition(blocks.max(axis=2), -k, axis=1)[:, -k:]  # (m, k) chunks
    rows = np.arange(m)[:, None]
    local = np.argpartition(blocks[rows, top].reshape(m, k * c), -k, axis=1)[:, -k:]
    ids = top[rows, local // c] * c + local % c
    return np.sort(ids, axis=1).astype(np.int32)


def to_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampling distribution (float64, sums to 1) over the vocabulary for one row of logits.

    Greedy (temperature 0) is the one-hot of the arg-max, so that acceptance rules see it as a distribution too.
    """
    n = logits.shape[-1]
    if params.greedy:
        p = np.zeros(n, np.float64)
        p[greedy_token(logits)] = 1.0
        return p
    # shift before dividing: the largest logit becomes exactly 0, so a tiny (even denormal) temperature gives
    # -inf for the rest (the arg-max limit) rather than inf - inf = NaN
    z = logits.astype(np.float64)
    with np.errstate(over="ignore"):
        z = (z - z.max()) / params.temperature
    keep: np.ndarray | None = None
    if 0 < params.top_k < n:
        keep = np.argpartition(-z, params.top_k - 1)[: params.top_k]
    if keep is None:
        keep = np.arange(n)
    zk = z[keep]
    zk = np.exp(zk - zk.max())
    zk /= zk.sum()
    if params.top_p < 1.0:
        order = np.argsort(-zk, kind="stable")
        csum = np.cumsum(zk[order])
        cut = int(np.searchsorted(csum, params.top_p, side="left")) + 1
        sel = order[:cut]
        keep, zk = keep[sel], zk[sel] / zk[sel].sum()
    p = np.zeros(n, np.float64)
    p[keep] = zk
    return p


def sample(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from distribution p with a uniform u in [0, 1)."""
    c = np.cumsum(p)
    i = int(np.searchsorted(c, u * c[-1], side="right"))
    i = min(i, p.shape[0] - 1)
    while p[i] == 0.0 and i > 0:  # u landed exactly on a boundary of zero mass
        i -= 1
    return i


def next_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token from one row of logits (greedy needs no random number)."""
    if params.greedy:
        return greedy_token(logits)
    return sample(to_probs(logits, params), float(rng.random()))
