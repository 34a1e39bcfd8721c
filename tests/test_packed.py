"""Row-interleaved (packed) Q4_0 / Q8_0 / Q6_K / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / F16 / BF16 weights of the C backend
(matmul_p*.c, cuca.kernels.packing): equal to the numpy twin of the raw matmul, bit-for-bit batch invariant (batch size,
position, threads, row prefixes), and behind Ops: file weights are packed once, their raw bytes stay readable,
in-memory weights stay raw."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf
import numpy as np
import pytest
from quant_data import random_weight

from cuca import quants as Q
from cuca.gguf import open_gguf
from cuca.kernels import _ref, implementations
from cuca.models.layers import Linear, linear
from cuca.models.ops import Ops

C = implementations().get("c")
PACKED = [t for t in (Q.Q4_0, Q.Q8_0, Q.Q6_K, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.F16, Q.BF16)
          if C is not None and C.pack_rows(t) > 0]
needs_packed = pytest.mark.skipif(not PACKED, reason="this build packs no format")
MS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32]
# odd numbers of blocks: a record (matmul_p.c) holds fewer; float formats: n_in % 8 != 0 (matmul_pf.c's tail)
N_IN = {Q.Q4_0: 352, Q.Q8_0: 352, Q.Q6_K: 768, Q.Q4_1: 352, Q.Q5_0: 352, Q.Q5_1: 352, Q.Q4_K: 768, Q.Q5_K: 768,
        Q.F16: 349, Q.BF16: 341}
TOL = 1e-6  # |C - numpy| / (|W| @ |x|), as tests/test_matmul.py


def packed(w: np.ndarray, wtype: int, n_in: int) -> np.ndarray:
    assert C is not None
    p = np.empty(w.nbytes, np.uint8)
    C.pack(w, wtype, w.shape[0], n_in, p)
    return p


def run(p: np.ndarray, wtype: int, n_rows: int, x: np.ndarray, n_out: int | None = None, threads: int = 0):
    assert C is not None
    out = np.full((x.shape[0], n_out or n_rows), np.nan, np.float32)
    C.matmul_packed(p, wtype, n_rows, x.shape[1], np.ascontiguousarray(x), out, threads)
    return out


def rows(n: int, n_in: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, n_in), dtype=np.float32)
    x[1] *= np.float32(1e-3)
    x[2, : n_in // 2] = 0.0
    return x


@needs_packed
@pytest.mark.parametrize("wtype", PACKED, ids=Q.type_name)
@pytest.mark.parametrize("n_out", [37, 48, 5])  # full groups + raw rows, whole groups, fewer rows than a group
def test_packed_matches_numpy(wtype: int, n_out: int) -> None:
    n_in = N_IN[wtype]
    w = random_weight(wtype, n_out, n_in, seed=wtype + n_out)
    p = packed(w, wtype, n_in)
    x = rows(40, n_in, seed=wtype)
    want = np.empty((40, n_out), np.float32)
    _ref.matmul(w, wtype, n_out, n_in, x, want)
    scale = (np.abs(Q.dequantize64(w, wtype, n_out, n_in)) @ np.abs(x.astype(np.float64)).T).T + 1e-30
    for M in MS:
        for start in (0, 40 - M):
            got = run(p, wtype, n_out, x[start : start + M])
            err = np.abs(got - want[start : start + M]) / scale[start : start + M]
            assert err.max() <= TOL, (M, start, err.max())


@needs_packed
@pytest.mark.parametrize("wtype", PACKED, ids=Q.type_name)
def test_packed_extreme_codes(wtype: int) -> None:
    """Codes at the ends of their range (Q8_0: -128, which quantizers never write, and +-127; Q6_K: 0 and 63 with
    scales -128 / +-127; Q4_K: 0 and 15 with scales and mins 0 and 63) against activations at +-127: the int16 pair
    sums of a u8 x s8 scheme that saturates (or wraps past the true range) would show here."""
    n_out, n_in = 21, 256  # two groups (AVX2) + raw rows
    rng = np.random.default_rng(wtype)
    w = random_weight(wtype, n_out, n_in, seed=wtype).reshape(n_out, n_in // Q.BLOCK[wtype][0], -1)
    if wtype == Q.Q6_K:  # ql, qh all-0 / all-1 bytes, then the 16 int8 scales; d (bytes 208, 209) kept
        w[:, :, :192] = rng.choice(np.array([0x00, 0xFF], np.uint8), w[:, :, :192].shape)
        w[:, :, 192:208] = rng.choice(np.array([-128, -127, 127], np.int8), w[:, :, 192:208].shape).view(np.uint8)
    elif wtype in (Q.Q4_K, Q.Q5_K):  # d, dmin kept; the 12 scale bytes all-0 / all-1 (every scale and min 0 or 63),
        # codes 0 / 15 (Q5_K: 5th bits all 0 / all 1 too)
        w[:, :, 4:16] = rng.choice(np.array([0x00, 0xFF], np.uint8), w[:, :, 4:16].shape)
        w[:, :, 16:] = rng.choice(np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8), w[:, :, 16:].shape)
    elif wtype == Q.Q8_0:
        w[:, :, 2:] = rng.choice(np.array([-128, -127, 127], np.int8), w[:, :, 2:].shape).view(np.uint8)
    elif wtype == Q.F16:  # the largest finite, a subnormal, -0 (converted by F16C in the kernel)
        w[...] = rng.choice(np.array([65504.0, -65504.0, 6e-8, -0.0], np.float16), w.shape)
    elif wtype == Q.BF16:  # bit patterns: +-8.3e34 (256 of them stay finite in float32), the smallest subnormal, -0
        bits = rng.choice(np.array([0x797F, 0xF97F, 0x0001, 0x8000], np.uint16), (n_out, n_in))
        w[...] = bits.view(np.uint8).reshape(w.shape)
    else:  # Q4_0 codes (Q5_0: qh and codes) after d; Q4_1 (Q5_1) after d and m: every 4 / 5-bit code 0 or the top
        c0 = 4 if wtype in (Q.Q4_1, Q.Q5_1) else 2
        w[:, :, c0:] = rng.choice(np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8), w[:, :, c0:].shape)
    w = np.ascontiguousarray(w.reshape(n_out, -1))
    x = rng.choice(np.array([-1.0, 1.0], np.float32), (9, n_in))
    x[0] = -1.0  # every product of a -128 code at its largest
    want = np.empty((9, n_out), np.float32)
    _ref.matmul(w, wtype, n_out, n_in, x, want)
    scale = (np.abs(Q.dequantize64(w, wtype, n_out, n_in)) @ np.abs(x.astype(np.float64)).T).T + 1e-30
    for M in (1, 4, 9):
        err = np.abs(run(packed(w, wtype, n_in), wtype, n_out, x[:M]) - want[:M]) / scale[:M]
        assert err.max() <= TOL, (M, err.max())


@needs_packed
@pytest.mark.parametrize("wtype", PACKED, ids=Q.type_name)
def test_packed_batch_invariance(wtype: int) -> None:
    """out[m] bit-identical whatever the batch (every M up to 17, the largest tile), the row's place, the threads,
    and how many rows are asked for; the n_out % R last rows (kept raw) included."""
    n_out, n_in = 53, N_IN[wtype]
    w = random_weight(wtype, n_out, n_in, seed=200 + wtype)
    p = packed(w, wtype, n_in)
    x = rows(40, n_in, seed=wtype)
    single = np.concatenate([run(p, wtype, n_out, x[m : m + 1], threads=1) for m in range(40)])
    raw = np.empty_like(single)
    assert C is not None
    C.matmul(w, wtype, n_out, n_in, x, raw, 2)
    assert np.array_equal(raw, single)  # the raw layout runs the same kernel: storage never changes a result
    rng = np.random.default_rng(wtype)
    for M in list(range(2, 18)) + [32, 40]:
        pick = rng.permutation(40)[:M]
        for threads in (1, 2):
            assert np.array_equal(run(p, wtype, n_out, x[pick], threads=threads), single[pick]), (M, threads)
        start = int(rng.integers(0, 41 - M))
        assert np.array_equal(run(p, wtype, n_out, x[start : start + M]), single[start : start + M]), M
    for n in (1, 7, 16, 21, 27, 48, 50):  # prefixes ending inside a group (either half of AVX2 Q4_0's 16-row one), on
        # its edge, in the raw rows
        assert np.array_equal(run(p, wtype, n_out, x[:9], n_out=n), single[:9, :n]), n


@needs_packed
@pytest.mark.parametrize("wtype", PACKED, ids=Q.type_name)
def test_packed_prefill_sized(wtype: int) -> None:
    n_out, n_in = 70, 512
    w = random_weight(wtype, n_out, n_in, seed=9)
    p = packed(w, wtype, n_in)
    x = rows(130, n_in, seed=9)
    batch = run(p, wtype, n_out, x, threads=2)
    for m in (0, 1, 2, 63, 64, 65, 129):
        assert np.array_equal(run(p, wtype, n_out, x[m : m + 1], threads=1), batch[m : m + 1]), m


@needs_packed
def test_pack_validation() -> None:
    assert C is not None
    t = PACKED[0]
    w = random_weight(t, 20, 64)
    p = packed(w, t, 64)
    x = np.zeros((2, 64), np.float32)
    for dst in (np.empty(w.nbytes - 1, np.uint8), np.empty(w.nbytes // 4, np.float32)):
        with pytest.raises((ValueError, TypeError), match="dst"):
            C.pack(w, t, 20, 64, dst)
    with pytest.raises(ValueError, match="w"):
        C.pack(w, t, 21, 64, np.empty(w.nbytes, np.uint8))
    with pytest.raises(ValueError, match="out"):
        C.matmul_packed(p, t, 20, 64, x, np.zeros((2, 21), np.float32))
    with pytest.raises(ValueError, match="x"):
        C.matmul_packed(p, t, 20, 64, np.zeros((2, 32), np.float32), np.zeros((2, 20), np.float32))
    with pytest.raises(ValueError, match="n_threads"):
        C.matmul_packed(p, t, 20, 64, x, np.zeros((2, 20), np.float32), -1)
    u = Q.F32  # float32 weights have no packed layout in any build
    wu = random_weight(u, 20, 256)
    with pytest.raises(ValueError, match="packed layout"):
        C.pack(wu, u, 20, 256, np.empty(wu.nbytes, np.uint8))


def _weights_file(path: Path, wtype: int, n_out: int, n_in: int) -> np.ndarray:
    raw = random_weight(wtype, n_out, n_in, seed=5)
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_tensor("w", raw, raw_shape=None, raw_dtype=gguf.GGMLQuantizationType(wtype))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return raw


@pytest.mark.parametrize("wtype", [Q.Q4_0, Q.Q8_0, Q.Q6_K, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.F16,
                                   Q.BF16], ids=Q.type_name)
def test_ops_packs_file_weights(tmp_path: Path, wtype: int) -> None:
    """A file weight is packed at its first matmul (where the build packs it; else, from 1 MiB, its raw rows are
    copied into the arena) and computes what matmul_packed (the raw kernel) does; Linear.w still reads the file's
    bytes; a row-prefix copy (Qwen35.head_rows) shares the packing."""
    n_out, n_in = 4096 + 37, 1024  # more than a page per group: the release path drops whole pages
    raw = _weights_file(tmp_path / "w.gguf", wtype, n_out, n_in)
    lin = linear(open_gguf(tmp_path / "w.gguf"), "w", n_out, n_in)
    ops = Ops(2)
    x = rows(3, n_in, seed=1)
    got = ops.matmul(lin, x)
    want = np.empty_like(got)
    if C is not None and C.pack_rows(wtype) > 0:
        assert isinstance(lin._packed, tuple)
        C.matmul_packed(packed(raw, wtype, n_in), wtype, n_out, n_in, x, want)
    else:
        ops.k.matmul(raw, wtype, n_out, n_in, x, want)
    assert np.array_equal(got, want)
    assert np.array_equal(np.asarray(lin.w), raw)  # released pages come back from the file
    head = copy.copy(lin)
    head.w, head.n_out = lin.w[:100], 100
    assert np.array_equal(ops.matmul(head, x), got[:, :100])
    if isinstance(lin._packed, tuple):
        assert isinstance(head._packed, tuple) and np.shares_memory(head._packed[1], lin._packed[1])
        assert lin._packed[3] == (C is not None and C.pack_rows(wtype) > 0)  # else: raw rows in huge pages


def test_ops_keeps_memory_weights_raw() -> None:
    """A weight not mapped from a file (requantized, gathered) is not packed: it would be held twice."""
    lin = object.__new__(Linear)
    lin.name, lin.wtype, lin.n_out, lin.n_in = "w", Q.Q4_0, 64, 256
    lin.w = random_weight(Q.Q4_0, 64, 256)
    ops = Ops(1)
    x = rows(3, 256, seed=2)
    want = np.empty((3, 64), np.float32)
    ops.k.matmul(lin.w, Q.Q4_0, 64, 256, x, want)
    assert np.array_equal(ops.matmul(lin, x), want)
    assert lin._packed is False


def test_ops_packs_requantized_weights() -> None:
    """A weight this process requantized (as_q8_0: owned) is packed where the build packs Q8_0, computes what the
    raw kernel does, and keeps its raw rows for gathers."""
    lin = object.__new__(Linear)
    lin.name, lin.wtype, lin.n_out, lin.n_in = "w", Q.F16, 96, 256
    lin._packed, lin._owned = None, False
    lin.w = rows(96, 256, seed=3).astype(np.float16).view(np.uint8).reshape(96, -1)
    q = lin.as_q8_0()
    assert q._owned and q.wtype == Q.Q8_0
    raw = np.array(q.w)
    ops = Ops(2)
    x = rows(3, 256, seed=4)
    want = np.empty((3, 96), np.float32)
    ops.k.matmul(raw, Q.Q8_0, 96, 256, x, want)
    assert np.array_equal(ops.matmul(q, x), want)
    assert isinstance(q._packed, tuple) == (C is not None and C.pack_rows(Q.Q8_0) > 0)
    assert np.array_equal(q.w, raw)


@needs_packed
@pytest.mark.parametrize("wtype", PACKED)
def test_packing_on_threads_gives_the_same_bytes(wtype: int) -> None:
    """pack() on 1..3 threads (a weight past the one-thread size, rows not a multiple of the threads' ranges nor
    of the interleave) gives the bytes of the one-thread packing."""
    assert C is not None
    n_out = 16 * 16 * 7 + 3  # past 1 MiB at R = 8 too
    w = random_weight(wtype, n_out, 2048, seed=4)
    assert w.nbytes > 1 << 20
    want = np.empty(w.nbytes, np.uint8)
    C.pack(w, wtype, n_out, 2048, want, 1)
    for nt in (0, 2, 3):
        got = np.empty(w.nbytes, np.uint8)
        C.pack(w, wtype, n_out, 2048, got, nt)
        assert np.array_equal(got, want), nt
    with pytest.raises(ValueError, match="n_threads"):
        C.pack(w, wtype, n_out, 2048, want, -1)


def test_arena_pieces_are_aligned_apart_and_as_large_as_asked() -> None:
    """Arena pieces: 64-byte aligned, never overlapping, from 2 MiB-aligned mappings; a piece larger than a chunk
    gets a mapping of its own; the bytes are writable and keep what is written."""
    from cuca.kernels.packing import Arena

    arena = Arena(chunk=4 << 20)
    sizes = [100, 64, 1 << 20, 3 << 20, 9 << 20, 5]
    pieces = [arena.alloc(n) for n in sizes]
    spans = sorted((p.ctypes.data, p.ctypes.data + p.nbytes) for p in pieces)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:], strict=False))
    assert [p.nbytes for p in pieces] == sizes and all(p.ctypes.data % 64 == 0 for p in pieces)
    assert pieces[0].ctypes.data % (2 << 20) == 0 and pieces[4].ctypes.data % (2 << 20) == 0
    for i, p in enumerate(pieces):
        p[:] = i
    assert all(int(p.min()) == int(p.max()) == i for i, p in enumerate(pieces))


def test_ops_packs_into_its_arena(tmp_path: Path) -> None:
    """A file weight packed by Ops takes its bytes from the Ops' arena (huge pages) and computes as before."""
    if C is None or C.pack_rows(Q.Q4_0) == 0:
        pytest.skip("this build packs no Q4_0")
    raw = _weights_file(tmp_path / "w.gguf", Q.Q4_0, 256, 512)
    lin = linear(open_gguf(tmp_path / "w.gguf"), "w", 256, 512)
    ops = Ops(1)
    x = rows(3, 512, seed=5)
    got = ops.matmul(lin, x)
    assert isinstance(lin._packed, tuple) and ops.arena._room is not None
    room = ops.arena._room
    assert room.ctypes.data <= lin._packed[1].ctypes.data < room.ctypes.data + room.nbytes
    want = np.empty_like(got)
    C.matmul_packed(packed(raw, Q.Q4_0, 512), Q.Q4_0, 256, 512, x, want)
    assert np.array_equal(got, want)


def test_ops_copies_large_unpacked_file_weights_into_its_arena(tmp_path: Path) -> None:
    """A mapped float weight past RAW_COPY_MIN (no packed layout) runs on its rows copied into the arena: the same
    outputs as the raw kernel on the file's bytes, a prefix view shares the copy, Linear.w still reads the file."""
    from cuca.kernels.packing import RAW_COPY_MIN

    n_out, n_in = 1024, 768
    w = rows(n_out, n_in, seed=6)  # F32: packed by no build
    assert w.nbytes >= RAW_COPY_MIN and (C is None or C.pack_rows(Q.F32) == 0)
    wr = gguf.GGUFWriter(str(tmp_path / "f.gguf"), "llama")
    wr.add_tensor("w", w)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    lin = linear(open_gguf(tmp_path / "f.gguf"), "w", n_out, n_in)
    ops = Ops(2)
    x = rows(3, n_in, seed=7)
    want = np.empty((3, n_out), np.float32)
    ops.k.matmul(np.array(lin.w), lin.wtype, n_out, n_in, x, want, 2)
    assert np.array_equal(ops.matmul(lin, x), want)
    if C is not None:
        assert isinstance(lin._packed, tuple) and lin._packed[3] is False
        assert not np.shares_memory(lin._packed[1], np.asarray(lin.w))
    assert np.array_equal(np.asarray(lin.w), w)
    head = copy.copy(lin)
    head.w, head.n_out = lin.w[:100], 100
    assert np.array_equal(ops.matmul(head, x), want[:, :100])


def _owned(wtype: int, n_out: int, n_in: int, seed: int) -> Linear:
    lin = object.__new__(Linear)
    lin.name, lin.wtype, lin.n_out, lin.n_in = f"w{seed}", wtype, n_out, n_in
    lin._packed, lin._owned, lin._fused = None, True, None
    lin.w = np.ascontiguousarray(random_weight(wtype, n_out, n_in, seed=seed)).view(np.uint8).reshape(n_out, -1)
    return lin


@needs_packed
@pytest.mark.parametrize("wtype", PACKED, ids=Q.type_name)
def test_matmuls_fused_equal_separate(wtype: int) -> None:
    """Ops.matmuls: weights packed back to back (all but the last filling whole row groups) give, in one call, the
    bits separate matmuls give; weights that cannot share a buffer (a partial group before the last, another
    format) run one by one; each weight alone still runs from its slice of the shared buffer."""
    assert C is not None
    R, n_in = C.pack_rows(wtype), N_IN[wtype]
    other = Q.Q8_0 if wtype != Q.Q8_0 else Q.Q4_0
    # (rows, formats, the run that shares a buffer); R == 1: rows packed in place
    cases = [((2 * R, R, R + 3), None, 3), ((R + 1, R), None, 2 if R == 1 else 0), ((R, R), None, 2),
             ((R, R + 1, R), None, 3 if R == 1 else 2)]
    if N_IN[other] == n_in:
        cases += [((R, R), (wtype, other), 0), ((R, 2 * R, R), (wtype, wtype, other), 2)]
    for i, (outs, fmts, run) in enumerate(cases):
        types = fmts or [wtype] * len(outs)
        ws = [_owned(t, n, n_in, seed=10 * i + j) for j, (t, n) in enumerate(zip(types, outs, strict=True))]
        ref = [_owned(t, n, n_in, seed=10 * i + j) for j, (t, n) in enumerate(zip(types, outs, strict=True))]
        ops, plain = Ops(2), Ops(2)
        plain.fuse_projections = False
        for M in (1, 4, 9):
            x = np.ascontiguousarray(rows(max(M, 3), n_in, seed=M)[:M])
            got, want = ops.matmuls(ws, x), plain.matmuls(ref, x)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (outs, M)
            assert all(g.flags.c_contiguous and g.shape == (M, n) for g, n in zip(got, outs, strict=True))
            assert np.array_equal(ops.matmul(ws[0], x), want[0])
        assert (len(ws[0]._fused.ws) if type(ws[0]._fused).__name__ == "Fused" else 0) == run, outs


class _Calls:
    """The C kernels, counting the calls of one of them."""

    def __init__(self, name: str):
        self.name, self.n = name, 0

    def __getattr__(self, attr: str) -> Any:
        fn = getattr(C, attr)
        if attr != self.name:
            return fn

        def call(*a: Any) -> Any:
            self.n += 1
            return fn(*a)

        return call


def _mlp(wtype: int, n_embd: int, n_ff: int, act: str, seed: int, raw_down: bool = False) -> SimpleNamespace:
    down = _owned(wtype, n_embd, n_ff, seed + 2)
    if raw_down:  # someone else's array: never packed nor copied, the raw kernel reads it where it is
        down._owned = False
    return SimpleNamespace(ffn_gate=_owned(wtype, n_ff, n_embd, seed), ffn_up=_owned(wtype, n_ff, n_embd, seed + 1),
                           ffn_down=down, act=act)


@needs_packed
@pytest.mark.parametrize("wtype", PACKED, ids=Q.type_name)
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_mlp_in_one_call_is_the_steps(wtype: int, act: str) -> None:
    """Ops.mlp: gate and up packed into one buffer, the activation and the down matmul (packed, or raw rows read in
    place) in one kernel call give the bits of the steps (separate matmuls, act_mul, matmul), for every row count and
    thread count; the one call is what runs."""
    assert C is not None
    n_embd, n_ff = N_IN[wtype], 256  # 256: whole row groups of every packing and whole blocks of every format
    for raw_down in (False, True):
        m, ref = (_mlp(wtype, n_embd, n_ff, act, wtype, raw_down) for _ in range(2))
        spy, steps = _Calls("mlp"), Ops(2)
        ops = Ops(2, spy)  # type: ignore[arg-type]
        steps.fuse_projections = False
        calls = 0
        for M, threads in ((1, 2), (3, 1), (4, 2), (9, 2)):
            ops.threads = steps.threads = threads
            x = np.ascontiguousarray(rows(max(M, 3), n_embd, seed=M)[:M])
            g, u = steps.matmuls([ref.ffn_gate, ref.ffn_up], x)
            want = steps.matmul(ref.ffn_down, steps.act_mul(act, g, u, g))
            assert np.array_equal(ops.mlp(m, x), want), (raw_down, M)
            calls += 1
        assert spy.n == calls and (m.ffn_down._packed is False) == raw_down


@needs_packed
def test_mlp_checks_its_arguments() -> None:
    """mlp names what is wrong: the activation, the thread count, a scratch or output of the wrong shape or overlapping
    another, a down matrix whose rows do not match, a gate / up buffer in a format this build does not pack."""
    assert C is not None
    wtype = PACKED[0]
    R, n_embd, n_ff = C.pack_rows(wtype), N_IN[wtype], 256
    m = _mlp(wtype, n_embd, n_ff, "silu", 5)
    gu = packed(np.concatenate([m.ffn_gate.w, m.ffn_up.w]), wtype, n_embd)
    down = packed(m.ffn_down.w, wtype, n_ff).reshape(n_embd, -1)
    x = rows(3, n_embd, seed=1)

    def call(*, act: int = 0, nt: int = 2, g: Any = None, out: Any = None, dn: Any = down, down_packed: bool = True,
             gu_wtype: int = wtype) -> None:
        g = np.empty((3, n_ff), np.float32) if g is None else g
        out = np.empty((3, n_embd), np.float32) if out is None else out
        C.mlp(gu, gu_wtype, 2 * n_ff, dn, wtype, dn.shape[0] * dn.shape[1] // (down.nbytes // n_embd), down_packed, x,
              g, np.empty((3, n_ff), np.float32), out, act, nt)

    call()
    with pytest.raises(ValueError, match="act"):
        call(act=2)
    with pytest.raises(ValueError, match="n_threads"):
        call(nt=-1)
    with pytest.raises(ValueError, match="g must be writeable with shape"):
        call(g=np.empty((2, n_ff), np.float32))
    flat = np.empty(3 * (n_ff + n_embd), np.float32)  # out starts 8 floats before the end of g
    with pytest.raises(ValueError, match="out overlaps"):
        call(g=flat[: 3 * n_ff].reshape(3, n_ff), out=flat[3 * n_ff - 8 : 3 * (n_ff + n_embd) - 8].reshape(3, n_embd))
    with pytest.raises(ValueError, match="down must be packed, with at least"):
        call(dn=packed(m.ffn_down.w[: n_embd - R], wtype, n_ff).reshape(n_embd - R, -1))
    with pytest.raises(ValueError, match="down must be raw, with exactly"):
        call(dn=np.concatenate([m.ffn_down.w, m.ffn_down.w[:R]]), down_packed=False)
    with pytest.raises(ValueError, match="gu has"):  # F32 rows of n_embd floats: not these bytes
        call(gu_wtype=Q.F32)


@needs_packed
def test_matmul_packed_split_checks_its_outputs() -> None:
    """matmul_packed_split names what is wrong: a boundary inside a row group, outputs that overlap, more rows than
    the tensor has, a row count that differs from x's."""
    assert C is not None
    wtype = PACKED[0]
    R, n_in = C.pack_rows(wtype), N_IN[wtype]
    p = packed(random_weight(wtype, 3 * R, n_in).reshape(3 * R, -1), wtype, n_in)
    x = rows(3, n_in, seed=1)
    C.matmul_packed_split(p, wtype, 3 * R, n_in, x, (np.empty((3, R), np.float32), np.empty((3, 2 * R), np.float32)))
    if R > 1:
        with pytest.raises(ValueError, match="not a multiple"):
            C.matmul_packed_split(p, wtype, 3 * R, n_in, x, (np.empty((3, R + 1), np.float32),
                                                             np.empty((3, R), np.float32)))
    big = np.empty((3, 2 * R), np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        C.matmul_packed_split(p, wtype, 3 * R, n_in, x, (big[:, :R].copy(), big, big))
    with pytest.raises(ValueError, match="more than n_rows"):
        C.matmul_packed_split(p, wtype, 3 * R, n_in, x, (np.empty((3, 2 * R), np.float32),
                                                         np.empty((3, 2 * R), np.float32)))
    with pytest.raises(ValueError, match="shape"):
        C.matmul_packed_split(p, wtype, 3 * R, n_in, x, (np.empty((2, R), np.float32),))
