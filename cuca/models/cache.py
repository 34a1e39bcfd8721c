"""Caches are explicit objects passed into `forward`; each says how far it rolls back."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import ContextLengthError


class Cache(Protocol):
    """What the engine and the speculative rounds need of a model's cache: `n` cached positions out of `n_ctx`,
    `trim(n)` to forget the last n (a rejected draft's rows), at most `max_rollback` of them after one forward
    batch (None: no limit)."""

    @property
    def n(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def max_rollback(self) -> int | None: ...

    @property
    def nbytes(self) -> int: ...

    def trim(self, n: int) -> None: ...

    def reset(self) -> None: ...


class KVCache:
    """Preallocated K/V buffers for the layers that own K/V.

    k[i]: float32 (n_kv_head, n_ctx, head_dim_k), v[i]: (n_kv_head, n_ctx, head_dim_v). `n` counts the valid
    positions; rollback is `trim(n)`, which only lowers the counter (rejected rows are overwritten later).
    """

    max_rollback: int | None = None  # any number of positions: trim only lowers the counter

    def __init__(self, n_ctx: int, shapes: list[tuple[int, int, int]]):
        self.n_ctx = n_ctx
        self.k = [np.zeros((h, n_ctx, dk), np.float32) for h, dk, _ in shapes]
        self.v = [np.zeros((h, n_ctx, dv), np.float32) for h, _, dv in shapes]
        self.n = 0

    def check_room(self, pos0: int, m: int) -> None:
        if pos0 + m > self.n_ctx:
            raise ContextLengthError(f"positions {pos0}..{pos0 + m - 1} exceed the context of {self.n_ctx} tokens")

    def store(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write k (M, n_kv_head, dk) and v (M, n_kv_head, dv) at positions pos0..pos0+M-1."""
        m = k.shape[0]
        self.k[layer][:, pos0 : pos0 + m, :] = k.transpose(1, 0, 2)
        self.v[layer][:, pos0 : pos0 + m, :] = v.transpose(1, 0, 2)

    def advance(self, pos_end: int) -> None:
        self.n = max(self.n, pos_end)

    def trim(self, n: int) -> None:
        """Forget the last n positions."""
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot trim {n} positions from a cache holding {self.n}")
        self.n -= n

    def reset(self) -> None:
        self.n = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)
