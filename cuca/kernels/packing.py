"""Row-interleaved weights, private to the C backend: a weight whose format the build packs (`pack_rows`: the 32-value
block formats, Q4_K, Q6_K, F16 and BF16; on AVX-512 also Q5_K) is repacked once, at its first matmul, into the layout of
`matmul_packed` (matmul_p.c, matmul_p6.c, matmul_p4k.c: one activation load feeds 16 (AVX-512) or 8 (AVX2)
output rows; matmul_pf.c: one x chunk feeds 4 float rows).
`Linear.w` and `Linear.wtype` keep their raw GGUF meaning for everyone else (cuca.quants, get_rows, other backends).

Memory-neutral for file weights: a weight mapped from a GGUF file has its mapped pages released once packed
(MADV_DONTNEED: they stay in the page cache and come back from the file if anyone reads `Linear.w` again), so one
copy of it is resident. A weight this process made itself (`Linear._owned`: a drafter's matrices requantized to
Q8_0) is packed too and its raw copy kept (row gathers and other backends read it): the E2B assistant's 262144-row
head costs 71 MB more, and its matmul runs at 3.4x the raw kernel's speed. Other in-memory weights stay raw.
A row prefix of a packed weight (`Qwen35.head_rows`: a view of the first n rows) uses the packed tensor too.

Weights that take the same x (a layer's q / k / v, gate / up) are packed back to back into one buffer where they
share a format and every one but the last fills whole row groups (`fused`; else the longest such run from the
first, as q / k where v has another format): one kernel call then computes all of them (one activation
quantization, one thread hand-off, one longer weight stream), each output row by the very kernel it runs alone
(bit-identical), and each weight's own packed form is its slice of that buffer.

Packed bytes live in an `Arena` (one per Ops): 64 MiB anonymous mappings asked for transparent huge pages, so that
the weight stream walks 2 MiB pages, not 4 KiB ones (E2B decode, AVX-512, 2 threads, interleaved in one process:
0.958x the time at M = 1, 0.952x at M = 4; Qwen 3.5 0.8B Q8_0 0.924x and 0.943x). At most the last huge page of
each mapping is partly unused.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ..models.layers import Linear

# (raw array the packing was made from, its bytes in the arena, rows, whether those are packed or raw rows copied)
Packed = tuple[np.ndarray, np.ndarray, int, bool]


class Fused(NamedTuple):
    """Weights packed back to back: `p` holds the `n_rows` rows of ws (format `wtype`, `n_in` wide), in their order."""

    ws: tuple[Linear, ...]
    p: np.ndarray
    wtype: int
    n_in: int
    n_rows: int


RAW_COPY_MIN = 1 << 20  # a mapped weight the build does not pack is copied into the arena from this size on

HUGE_PAGE = 2 << 20
ARENA_CHUNK = 64 << 20


class Arena:
    """Room for packed weights: anonymous mappings of `chunk` bytes (or one weight's size, if larger) advised
    MADV_HUGEPAGE where the system has it, handed out in 64-byte-aligned pieces (whole cache lines per vector
    load). Pieces live as long as the arrays viewing them."""

    def __init__(self, chunk: int = ARENA_CHUNK):
        self.chunk = chunk
        self._room: np.ndarray | None = None  # the current mapping's unused part, 2 MiB-aligned at its start
        self._used = 0
        self._lock = threading.Lock()  # requests on several threads may pack their first weights at once

    def alloc(self, n: int) -> np.ndarray:
        """n uninitialised bytes."""
        need = -(-n // 64) * 64
        with self._lock:
            if self._room is None or self._used + need > self._room.size:
                self._room, self._used = _huge_map(max(self.chunk, -(-need // HUGE_PAGE) * HUGE_PAGE)), 0
            a = self._room[self._used : self._used + n]
            self._used += need
        return a


def _huge_map(size: int) -> np.ndarray:
    """size bytes of a fresh anonymous mapping, starting on a 2 MiB boundary (np.empty where mmap cannot)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(size, np.uint8)
    mm = mmap.mmap(-1, size + HUGE_PAGE, flags=flags)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(mm, np.uint8)  # keeps mm alive
    off = -a.ctypes.data % HUGE_PAGE
    return a[off : off + size]


def operand(k: ModuleType, w: Linear, threads: int, arena: Arena | None = None) -> tuple[np.ndarray, int, bool]:
    """What the kernels read for w: (its packed buffer, the buffer's rows, True), or (its rows as they are: a huge-page
    copy or w.w itself, n_out, False); w is packed at the first call, taking its bytes from `arena` (None: numpy)."""
    p = getattr(w, "_packed", None)
    if not (isinstance(p, tuple) and p[0] is w.w):  # packed already (the common case: hundreds of calls a token)
        p = _packed(k, w, p, threads, arena)
        w._packed = p if p is not None else False
    return (w.w, w.n_out, False) if p is None else (p[1], p[2], p[3])


def matmul(k: ModuleType, w: Linear, x: np.ndarray, out: np.ndarray, threads: int, arena: Arena | None = None) -> None:
    """out = x @ W.T through the packed layout where this backend and weight have one, else the raw kernel."""
    buf, rows, packed = operand(k, w, threads, arena)
    if packed:
        k.matmul_packed(buf, w.wtype, rows, w.n_in, x, out, threads)
    else:
        k.matmul(buf, w.wtype, w.n_out, w.n_in, x, out, threads)


def fused(k: ModuleType, ws: Sequence[Linear], threads: int, arena: Arena) -> Fused | None:
    """The one packed buffer of the longest run ws[:n] (n >= 2) that can share one (made at the first call, kept on
    ws[0]; Fused.ws says which), or None: a backend without packing, a second weight of another format or width, a
    format this build does not pack, a first weight whose rows do not fill whole groups, a weight packed alone
    already, or weights that are not a file's or owned."""
    f = getattr(ws[0], "_fused", None)
    if isinstance(f, Fused) and f.ws == tuple(ws[: len(f.ws)]):
        return f
    if f is False:
        return None
    f = _fuse(k, ws, threads, arena)
    ws[0]._fused = f if f is not None else False
    return f


def _fuse(k: ModuleType, ws: Sequence[Linear], threads: int, arena: Arena) -> Fused | None:
    pack_rows = getattr(k, "pack_rows", None)
    w0 = ws[0]
    R = pack_rows(w0.wtype) if pack_rows is not None else 0
    if R == 0:
        return None
    n = 1  # the run: one format and width, every weight but its last filling whole row groups
    while n < len(ws) and ws[n].wtype == w0.wtype and ws[n].n_in == w0.n_in and ws[n - 1].n_out % R == 0:
        n += 1
    run = ws[:n]
    if n < 2 or run[-1].n_out < R:
        return None
    maps = [_file_map(w.w) for w in run]
    if any(w._packed is not None or (mm is None and not w._owned) for w, mm in zip(run, maps, strict=True)):
        return None
    dst = arena.alloc(sum(w.w.nbytes for w in run))
    off = 0
    for w, mm in zip(run, maps, strict=True):
        w._packed = _pack_into(k, w, mm, dst[off : off + w.w.nbytes], threads)
        off += w.w.nbytes
    return Fused(tuple(run), dst, w0.wtype, w0.n_in, sum(w.n_out for w in run))


def _packed(k: ModuleType, w: Linear, p: object, threads: int, arena: Arena | None) -> Packed | None:
    """w's packed form when its last one (p) is stale or missing: p False (none), p for another array (a row prefix
    of a packed weight), or packed now."""
    if p is False:
        return None
    return _prefix(p, w) if isinstance(p, tuple) else _pack(k, w, threads, arena)


def _prefix(p: Packed, w: Linear) -> Packed | None:
    """A copy of a packed Linear whose w is now a view of the first n rows of the packed one's w."""
    src = p[0]
    same = (isinstance(w.w, np.ndarray) and w.w.ndim == 2 and w.w.shape[1] == src.shape[1]
            and w.w.shape[0] <= src.shape[0]
            and w.w.__array_interface__["data"][0] == src.__array_interface__["data"][0])
    if not same:
        return None
    return (w.w, p[1], p[2], True) if p[3] else (w.w, p[1][: w.w.shape[0]], w.w.shape[0], False)


def _file_map(a: np.ndarray) -> mmap.mmap | None:
    mm = getattr(a, "_mmap", None)
    return mm if isinstance(a, np.memmap) and isinstance(mm, mmap.mmap) and a.flags.c_contiguous else None


def _pack(k: ModuleType, w: Linear, threads: int, arena: Arena | None) -> Packed | None:
    pack_rows = getattr(k, "pack_rows", None)
    if pack_rows is None:
        return None
    mm = _file_map(w.w)
    if pack_rows(w.wtype) == 0 or w.n_out < pack_rows(w.wtype):
        return _copy_raw(w, mm, arena)
    if mm is None and not getattr(w, "_owned", False):  # someone else's array: it would be held twice
        return None
    if arena is not None:
        dst = arena.alloc(w.w.nbytes)
    else:
        buf = np.empty(w.w.nbytes + 64, np.uint8)
        off = -buf.ctypes.data % 64  # whole cache lines per vector load
        dst = buf[off : off + w.w.nbytes]
    return _pack_into(k, w, mm, dst, threads)


def _pack_into(k: ModuleType, w: Linear, mm: mmap.mmap | None, dst: np.ndarray, threads: int) -> Packed:
    """w packed into dst (on the matmul's threads), its file mapping (mm, if any) released."""
    k.pack(w.w, w.wtype, w.n_out, w.n_in, dst, threads)
    if mm is not None:
        _release(mm, w.w)
    return (w.w, dst, w.n_out, True)


def _copy_raw(w: Linear, mm: mmap.mmap | None, arena: Arena | None) -> Packed | None:
    """A large mapped weight this build does not pack: its rows as they are, copied into the arena's huge pages
    (the mapping released: memory-neutral), for the raw kernel. The E2B Q6_K head on AVX-512 (2 threads,
    interleaved): 0.90-0.92x the time of reading the file mapping."""
    if mm is None or arena is None or w.w.nbytes < RAW_COPY_MIN:
        return None
    dst = arena.alloc(w.w.nbytes).view(w.w.dtype).reshape(w.w.shape)
    dst[...] = w.w
    _release(mm, w.w)
    return (w.w, dst, w.n_out, False)


def _release(mm: mmap.mmap, a: np.ndarray) -> None:
    """Drop the mapped pages of a (whole pages inside it) from this process; they stay readable."""
    base = np.frombuffer(mm, np.uint8).ctypes.data
    lo = a.ctypes.data - base
    start = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (lo + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)
