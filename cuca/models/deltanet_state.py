"""`deltanet_state`: the recurrent side of the Qwen 3.5 hybrid: `HybridCache` (attention K/V plus the DeltaNet
layers' conv windows and recurrent states) and `gdn_chunked`, the chunked DeltaNet form (the torch backend's long
prefills).

Rollback of a batch of up to `max_rollback + 1` tokens (a verify pass), and the raw conv inputs rebuild the windows.
Where the backend allows it (`Ops.deferred_states`, the CPU) the batch's state updates are not stored: the kernel
keeps each token's record (its normalised k, d = beta (v - kv) and exp(g)) and the next pass applies the kept ones
first, the float operations of their own pass, so `trim(n)` only drops records. Snapshots after every token of a
verify pass wrote 3 states of 1 MiB per layer at 4 rows (Qwen 3.5 0.8B, the kernel alone, 18 layers: 5.6 ms against
2.6 ms with 2 records applied; AVX2 Zen 3, 2 threads). Else the kernel writes the state after every token, and
`trim(n)` restores the one after the last kept token; where `Ops.relocatable_states` the live state becomes that
snapshot slot (no copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .qwen35 import Config

L2_EPS = 1e-6  # the q/k L2 norm of the DeltaNet layers (fixed in the reference, not a GGUF key)
MAX_ROLLBACK = 16  # drafts per verification call: the cache keeps this many per-token snapshots


class HybridCache:
    """K/V for the attention layers + conv windows and recurrent states for the DeltaNet layers.

    `n` counts cached positions. After a forward batch of 2..max_snaps+1 tokens, `trim(n)` restores the
    recurrent states saved after the last kept token and the conv windows rebuilt from that batch's raw inputs;
    the attention layers just forget positions. Deeper rollbacks raise; `max_rollback` says how deep a speculative
    round may go (its drafts), so that a round never asks for one.
    """

    def __init__(self, n_ctx: int, c: Config, ops: Any = None, max_snaps: int = MAX_ROLLBACK):
        from .ops import Ops

        self.ops = ops = ops if ops is not None else Ops()  # whose arrays the cache holds
        self.kv = ops.kv_cache(n_ctx, [(c.n_head_kv, c.head_dim, c.head_dim)] * sum(not r for r in c.recurrent))
        n_rec = sum(c.recurrent)
        self.conv = [ops.zeros((c.conv - 1, c.conv_dim)) for _ in range(n_rec)]
        self._own = [ops.zeros((c.v_heads, c.d_state, c.d_state)) for _ in range(n_rec)]
        self.ssm = list(self._own)  # the live states: a layer's own array, or (after a trim) a slot of its snapshots
        self._relocate = bool(getattr(ops, "relocatable_states", False))
        self._slot = [-1] * n_rec  # the snapshot slot each live state is (-1: its own array)
        self._base = [0] * n_rec  # the first slot the running batch's snapshots go to
        self.max_snaps = max_snaps
        self._shape = (c.v_heads, c.d_state, c.d_state)
        self._snaps: list[np.ndarray | None] = [None] * n_rec
        self._raw: list[np.ndarray | None] = [None] * n_rec  # [conv window before | raw rows] of the last batch
        self._kept = 0  # tokens of the last batch still cached that a trim may fall back into (0: none)
        self._snapped = False
        self._m = 0  # rows of the batch running now
        self.deferred = bool(getattr(ops, "deferred_states", False))
        self._w = 2 * c.d_state + 1  # floats of a token's record per head
        self._recs: list[list[np.ndarray] | None] = [None] * n_rec  # per layer two record buffers, in turn
        self._cur = 0  # which buffer holds the pending records
        self._pend = 0  # tokens whose state updates are records not yet applied (the same in every layer)
        # the prompt cache sets save_every (its prefill chunk): a batch of exactly that many rows ending at a multiple
        # of it is a full prefill chunk, whose end state a cold prefill reaches too; `saved` keeps the latest
        self.save_every = 0
        self.saved: tuple[int, list[np.ndarray]] | None = None

    @property
    def n(self) -> int:
        return self.kv.n

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    @property
    def k(self) -> list[np.ndarray]:
        return self.kv.k

    @property
    def v(self) -> list[np.ndarray]:
        return self.kv.v

    def store(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        self.kv.store(layer, pos0, k, v)

    @property
    def max_rollback(self) -> int:
        return self.max_snaps

    def check_room(self, pos0: int, m: int) -> None:
        self.kv.check_room(pos0, m)
        if pos0 != self.kv.n:
            raise ValueError(f"a recurrent cache holding {self.kv.n} positions cannot continue at position {pos0}")

    def begin(self, m: int) -> bool:
        """A batch of m tokens starts: whether it may be rolled back (per-token snapshots or records kept)."""
        self._kept, self._snapped, self._m = m, 1 < m <= self.max_snaps + 1, m
        if self.deferred:  # a rollable batch (_snapped) keeps its state updates as records
            if m > self.max_snaps + 1:  # a long prefill (maybe the chunked form): the pending records go in first
                self.commit()
            return self._snapped
        if self._snapped:  # the m-1 snapshots go to slots apart from the one a live state is
            for li, s in enumerate(self._slot):
                if s < 0 or m - 1 <= s:
                    self._base[li] = 0
                elif s + m <= self.max_snaps:
                    self._base[li] = s + 1
                else:  # no room on either side: the state moves back to its own array
                    self._own[li][...] = self.ssm[li]
                    self.ssm[li], self._slot[li], self._base[li] = self._own[li], -1, 0
        return self._snapped

    def snaps(self, li: int) -> np.ndarray | None:
        if not self._snapped:
            return None
        s = self._snaps[li]
        if s is None:
            s = self._snaps[li] = self.ops.snapshot_buffer((self.max_snaps, *self._shape))
        base = self._base[li]
        return s[base : base + self._m - 1]

    def records(self, li: int) -> Any:
        """Layer li's records for this batch's deferred deltanet call (ops.Records)."""
        from .ops import Records

        bufs = self._recs[li]
        if bufs is None:
            shape = (self.max_snaps + 1, self._shape[0], self._w)
            bufs = self._recs[li] = [self.ops.zeros(shape), self.ops.zeros(shape)]
        return Records(bufs[self._cur], self._pend, bufs[1 - self._cur] if self._snapped else None, self._snapped)

    def commit(self) -> None:
        """Apply the pending records to the states (in place): the batch before can no longer be rolled back."""
        if self._pend:
            for li, st in enumerate(self.ssm):
                self._apply(li, st)
        self._pend, self._kept = 0, 0

    def _apply(self, li: int, state: np.ndarray) -> None:
        from .ops import Records

        h, dk, dv = self._shape
        z = self.ops.zeros((0, h, dk))
        gz = self.ops.zeros((0, h))
        bufs = self._recs[li]
        assert bufs is not None
        self.ops.deltanet_deferred((z, z, z), (gz, gz), state, Records(bufs[self._cur], self._pend, None, False),
                                   (L2_EPS, 1.0))

    def states(self) -> list[np.ndarray]:
        """Copies of the recurrent states as of the last cached position (pending records applied to the copies)."""
        out = [self.ops.copy(a) for a in self.ssm]
        if self._pend:
            for li, st in enumerate(out):
                self._apply(li, st)
        return out

    def keep_raw(self, li: int, x: np.ndarray) -> None:
        self._raw[li] = x

    def advance(self, pos_end: int) -> None:
        self.kv.advance(pos_end)
        if self.deferred:  # the batch's records are now the pending ones (or it stored its state)
            self._pend, self._cur = (self._m, 1 - self._cur) if self._snapped else (0, self._cur)
        every = self.save_every
        if every and self._m == every and pos_end % every == 0:
            self.saved = self.snapshot()

    def trim(self, n: int) -> None:
        """Forget the last n positions (at most the last batch minus its first token)."""
        if n == 0:
            return
        if not self._snapped or not 0 < n < self._kept:
            raise ValueError(f"cannot roll the recurrent state back by {n} positions (the last batch left "
                             f"{self._kept} positions{'' if self._snapped else ' without snapshots'})")
        keep = self._kept - n
        if self.deferred:
            self._pend = keep
            for li, conv in enumerate(self.conv):
                raw = self._raw[li]
                assert raw is not None
                conv[...] = raw[keep : keep + conv.shape[0]]
            self.kv.trim(n)
            self._kept = keep
            return
        for li, st in enumerate(self.ssm):
            snaps, raw = self._snaps[li], self._raw[li]
            assert snaps is not None and raw is not None
            slot = self._base[li] + keep - 1
            if self._relocate:
                self.ssm[li], self._slot[li] = snaps[slot], slot
            else:
                st[...] = snaps[slot]
            self.conv[li][...] = raw[keep : keep + self.conv[li].shape[0]]
        self.kv.trim(n)
        self._kept = keep

    def snapshot(self) -> tuple[int, list[np.ndarray]]:
        """The state at this point (positions held, conv windows, recurrent states), for `restore`: how a drafter
        with this cache returns past more than one forward batch, and what the prompt cache keeps of a prompt (K/V
        rows are only counted, not copied: those before the snapshot must not be rewritten before a restore)."""
        return self.kv.n, [*(self.ops.copy(a) for a in self.conv), *self.states()]

    def restore(self, snap: tuple[int, list[np.ndarray]]) -> None:
        """Back to a `snapshot` taken at or before the current position (later K/V rows are forgotten)."""
        n, arrays = snap
        if n > self.kv.n:
            raise ValueError(f"cannot restore a snapshot at {n} positions into a cache holding {self.kv.n}")
        for dst, src in zip((*self.conv, *self.ssm), arrays, strict=True):
            dst[...] = src
        self.kv.n = n
        self._kept, self._snapped, self._pend = 0, False, 0

    def reset(self) -> None:
        self.kv.reset()
        for a in (*self.conv, *self.ssm):
            a[...] = 0.0
        self._kept, self._snapped, self._pend = 0, False, 0

    @property
    def nbytes(self) -> int:
        extra = sum(a.nbytes for a in (*self.conv, *self._own))
        recs = sum(b.nbytes for bufs in self._recs if bufs is not None for b in bufs)
        return self.kv.nbytes + extra + recs + sum(s.nbytes for s in self._snaps if s is not None)


def _aligned(shape: tuple[int, ...], align: int = 64) -> np.ndarray:
    """An uninitialised float32 array whose data starts on an `align`-byte boundary (the deltanet kernel streams
    snapshots with non-temporal stores when it can)."""
    n = int(np.prod(shape))
    raw = np.empty(n + align // 4, np.float32)
    off = (-raw.ctypes.data % align) // 4
    return raw[off : off + n].reshape(shape)


def gdn_chunked(qkv: tuple[np.ndarray, np.ndarray, np.ndarray], gates: tuple[np.ndarray, np.ndarray],
                state: np.ndarray, out: np.ndarray, scale: float, chunk: int = 64) -> None:
    """The chunked (parallel) form of the deltanet kernel, in float64 numpy (the reference of the torch backend's
    long prefills; the CPU's run the recurrence, Ops.deltanet_chunk_min): the same arguments
    grouped as `ops.deltanet` groups them (q, k, v), (g, beta), the same results up to rounding, but only the final
    state (no snapshots)."""
    (q, k, v), (g, beta) = qkv, gates
    f8 = np.float64
    q64, k64 = q.astype(f8), k.astype(f8)
    q64 = q64 / np.sqrt(np.sum(q64 * q64, -1, keepdims=True) + L2_EPS) * scale
    k64 = k64 / np.sqrt(np.sum(k64 * k64, -1, keepdims=True) + L2_EPS)
    s = state.astype(f8)
    T = q.shape[0]
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        qc, kc, vc = (a[sl].transpose(1, 0, 2) for a in (q64, k64, v.astype(f8)))  # (H, n, d)
        gc, bc = g[sl].astype(f8).T, beta[sl].astype(f8).T  # (H, n)
        n = qc.shape[1]
        cg = np.cumsum(gc, axis=1)
        diff = cg[:, :, None] - cg[:, None, :]
        lower = np.tril(np.ones((n, n), bool))
        gam = np.where(lower, np.exp(np.where(lower, diff, 0.0)), 0.0)
        kk = np.einsum("hid,hjd->hij", kc, kc)
        a = np.tril(bc[:, :, None] * kk * gam, -1)
        lmat = a + np.eye(n)
        eg = np.exp(cg)[:, :, None]
        u = np.linalg.solve(lmat, bc[:, :, None] * vc)
        w = np.linalg.solve(lmat, bc[:, :, None] * kc * eg)
        vp = u - w @ s
        qk = np.einsum("hid,hjd->hij", qc, kc) * gam
        o = (qc * eg) @ s + qk @ vp
        out[sl] = o.transpose(1, 0, 2)
        last = cg[:, -1]
        s = np.exp(last)[:, None, None] * s + (kc * np.exp(last[:, None] - cg)[:, :, None]).transpose(0, 2, 1) @ vp
    state[...] = s
