"""Matmul kernel timings per weight format at decode-sized batches.

For every format and a few realistic shapes (gemma-3-270m's: 640x2048, 2048x640 (2048x1024 for the K formats,
whose rows must be multiples of 256) and the 262144x640 Q8_0 LM head), time out = x @ W^T at M = 1, 2, 4, 8,
16, 17 rows of x and print the time at M=1, the weight bandwidth it implies, and the cost of each M relative
to M=1.

Q4_0 / Q8_0 run in the row-interleaved layout where the build packs them (as a model's file weights do).

Hot (default): the best of --reps calls on one weight tensor, which then sits in the caches.
--cold-mb N: sweep over enough copies of each weight tensor to stream N MB per sweep, so the weights come from
memory as in a real forward pass (the median call counts). The copies sit in huge pages (packing.Arena, as a
model's packed and raw-copied weights do): in 4 KiB pages the kernels' software prefetches run ahead into pages the
TLB does not hold yet, and some formats read up to 2x slower than they do in a model (AVX-512 Q4_1 at M = 3-4).

    python benchmarks/bench_kernels.py --threads 2 --cold-mb 1024

--passes FOLDER: per weight format, a whole forward pass instead of one matmul, cuca vs llama.cpp on the same file:
a llama-layout model (hidden 2048, FFN 5632, 4 layers, 16/4 heads of 128, 1016-token vocabulary; every matrix in
that format, about 100-360 MB, so the weights stream from memory) is written into FOLDER once per format, and the
cost of an M-row pass (logits for every row, as a verify pass) relative to M = 1 is printed for M = 1..17.

    python benchmarks/bench_kernels.py --threads 2 --passes /tmp/cuca-kernels [--formats Q4_0 Q8_0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads must not spin on our cores

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's cuca, not an installed one
from quant_data import random_weight  # noqa: E402
from synth import _vocab  # noqa: E402

from cuca import quants as Q  # noqa: E402
from cuca.kernels import ISA, impl, packing  # noqa: E402

FORMATS = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
MS = [1, 2, 4, 8, 16, 17]


def weight(wtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Random weights; big tensors repeat a random 4096-row slab (the kernels cannot tell)."""
    if n_out <= 4096:
        return random_weight(wtype, n_out, n_in)
    slab = random_weight(wtype, 4096, n_in)
    return np.tile(slab, (n_out // 4096, 1))


def _in_arena(arena: packing.Arena, a: np.ndarray) -> np.ndarray:
    """A copy of `a` in the arena's huge pages."""
    b = arena.alloc(a.nbytes).view(a.dtype).reshape(a.shape)
    b[...] = a
    return b


def bench(wtype: int, n_out: int, n_in: int, reps: int, threads: int, cold_mb: float) -> dict[int, float]:
    """Seconds per call for each M. Hot: the best of `reps` calls, the M values taking turns (so that load from
    elsewhere hits them alike). Cold: the median over two sweeps of the weight copies."""
    w = weight(wtype, n_out, n_in)
    packed = getattr(impl, "pack_rows", lambda t: 0)(wtype) > 0  # what a model's file weights run (packing.py)
    if packed:
        p = np.empty(w.nbytes, np.uint8)
        impl.pack(w, wtype, n_out, n_in, p)
        w = p
    copies = max(1, int(np.ceil(cold_mb * 2**20 / w.nbytes))) if cold_mb > 0 else 1
    arena = packing.Arena()
    ws = [_in_arena(arena, w) for _ in range(copies)] if copies > 1 else [w]
    rng = np.random.default_rng(0)
    xs = {M: rng.standard_normal((M, n_in), dtype=np.float32) for M in MS}
    outs = {M: np.empty((M, n_out), np.float32) for M in MS}

    def call(wi: np.ndarray, M: int) -> float:
        t0 = time.perf_counter()
        if packed:
            impl.matmul_packed(wi, wtype, n_out, n_in, xs[M], outs[M], threads)
        else:
            impl.matmul(wi, wtype, n_out, n_in, xs[M], outs[M], threads)
        return time.perf_counter() - t0

    if copies > 1:
        return {M: float(np.median([call(ws[i % copies], M) for i in range(2 * copies)])) for M in MS}
    for M in MS:  # warm up
        call(w, M)
    best = dict.fromkeys(MS, float("inf"))
    for _ in range(reps):
        for M in MS:
            best[M] = min(best[M], call(w, M))
    return best


PASS_MS = list(range(1, 18))
PASS_SHAPE = {"n_embd": 2048, "n_ff": 5632, "n_layer": 4, "n_head": 16, "n_head_kv": 4, "head_dim": 128,
              "n_vocab": 1016}


def _slab_weight(wtype: int, n_out: int, n_in: int, cache: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    """Raw data of an n_out x n_in tensor of type wtype: a random 256-row slab, tiled (quantizing it all is slow)."""
    key = (wtype, n_in)
    if key not in cache:
        cache[key] = random_weight(wtype, 256, n_in, seed=len(cache))
    slab = cache[key]
    reps = -(-n_out // 256)
    return np.ascontiguousarray(np.concatenate([slab] * reps)[:n_out])


def write_format_model(path: Path, fmt: str) -> Path:
    """A llama-layout GGUF whose every matrix (the tied embedding / LM head included) is in format `fmt`."""
    import gguf

    if path.exists():
        return path
    s = PASS_SHAPE
    t = getattr(Q, fmt)
    w = gguf.GGUFWriter(str(path.with_suffix(".tmp")), "llama")
    a = "llama"
    for k, v in {"context_length": 2048, "embedding_length": s["n_embd"], "block_count": s["n_layer"],
                 "feed_forward_length": s["n_ff"], "attention.head_count": s["n_head"],
                 "attention.head_count_kv": s["n_head_kv"], "attention.key_length": s["head_dim"],
                 "attention.value_length": s["head_dim"], "rope.dimension_count": s["head_dim"]}.items():
        w.add_uint32(f"{a}.{k}", v)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    toks, scores, types = _vocab(s["n_vocab"])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    cache: dict[tuple[int, int], np.ndarray] = {}
    gt = gguf.GGMLQuantizationType(t)

    def mat(name: str, n_out: int, n_in: int) -> None:
        raw = _slab_weight(t, n_out, n_in, cache)
        if t == Q.F16:
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_shape=None, raw_dtype=gt)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, np.float32))

    e, hd = s["n_embd"], s["head_dim"]
    mat("token_embd.weight", s["n_vocab"], e)
    norm("output_norm.weight", e)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", e)
        mat(p + "attn_q.weight", s["n_head"] * hd, e)
        mat(p + "attn_k.weight", s["n_head_kv"] * hd, e)
        mat(p + "attn_v.weight", s["n_head_kv"] * hd, e)
        mat(p + "attn_output.weight", e, s["n_head"] * hd)
        norm(p + "ffn_norm.weight", e)
        mat(p + "ffn_gate.weight", s["n_ff"], e)
        mat(p + "ffn_up.weight", s["n_ff"], e)
        mat(p + "ffn_down.weight", e, s["n_ff"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.with_suffix(".tmp").rename(path)
    return path


def pass_costs(folder: Path, formats: list[str], threads: int, plan: tuple[int, list[int] | None] = (3, None),
               llama: bool = True, log=print) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """Per format: M-row pass times (ms, best of reps) for cuca (logits for every row) and llama.cpp's native build
    (llama-bench pp M, same run), and their cost relative to M = 1. plan = (reps, the M values or None: PASS_MS)."""
    reps, ms = plan
    from cuca.bench import PeerError, find_peer
    from cuca.engine import Engine
    from cuca.gguf import open_gguf
    from cuca.models import load_model
    from cuca.models.layers import Ops

    ms = ms or PASS_MS
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict] = {}
    prompt = [2] + [int(t) for t in np.random.default_rng(0).integers(300, 1000, 15)]
    for fmt in formats:
        path = write_format_model(folder / f"llama-passes-{fmt.lower()}.gguf", fmt)
        eng = Engine(load_model(open_gguf(path), Ops(threads)), 256)
        res: dict[str, dict] = {}
        ours = dict.fromkeys(ms, float("inf"))
        for _ in range(reps):
            for m in ms:
                eng.cache.reset()
                eng.prefill(prompt)
                toks = np.full(m, 500, np.int32)
                pos = np.arange(eng.cache.n, eng.cache.n + m, dtype=np.int32)
                t0 = time.perf_counter()
                eng.model.forward(toks, pos, eng.cache, "all")
                ours[m] = min(ours[m], (time.perf_counter() - t0) * 1e3)
        res["cuca"] = ours
        del eng
        peer = find_peer(threads) if llama else None
        if peer is not None:
            try:
                res["llama.cpp"] = {int(m): v for m, v in peer.pass_ms(path, ms, reps)["ms"].items()}
            except PeerError as e:
                log(f"  llama.cpp could not run {path.name}: {e}")
        out[fmt] = {who: {"ms": {str(m): round(v, 3) for m, v in t.items()},
                          "cost": {str(m): round(v / t[1], 3) for m, v in t.items()}} for who, t in res.items()}
        for who, t in res.items():
            log(f"{fmt:5s} {who:9s} M=1 {t[1]:7.2f} ms  cost " + " ".join(f"{t[m] / t[1]:4.2f}" for m in ms))
        if "llama.cpp" in res:
            log(f"{fmt:5s} cuca/llama.cpp time at M=1: {res['cuca'][1] / res['llama.cpp'][1]:.2f}, "
                f"at M=4: {res['cuca'][4] / res['llama.cpp'][4]:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP threads (0: all)")
    ap.add_argument("--reps", type=int, default=30, help="calls per point; the best one counts")
    ap.add_argument("--cold-mb", type=float, default=0.0, help="MB of weights streamed per round")
    ap.add_argument("--formats", nargs="*", default=FORMATS)
    ap.add_argument("--no-lm-head", action="store_true", help="skip the 262144x640 Q8_0 shape")
    ap.add_argument("--passes", type=Path, default=None, metavar="FOLDER",
                    help="whole-pass cost vs M per format, cuca vs llama.cpp, on models written into FOLDER")
    ap.add_argument("--pass-reps", type=int, default=3, help="--passes: repetitions per M (the best counts)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.passes is not None:
        print(f"M-row pass cost relative to M=1, M = 1..17, threads={args.threads or 'all'}")
        res = pass_costs(args.passes, args.formats, args.threads or (os.cpu_count() or 1), (args.pass_reps, None),
                         llama=not args.no_llama)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        return

    print(f"backend={impl.__name__} isa={ISA} threads={args.threads or 'all'} cold_mb={args.cold_mb:g}")
    head = f"{'format':6s} {'n_out x n_in':>13s} {'MB':>7s} {'M=1 us':>9s} {'GB/s':>6s}  " + " ".join(
        f"{'M=' + str(m):>5s}" for m in MS[1:]
    )
    print(head)
    print("-" * len(head))
    cases: list[tuple[str, int, int]] = []
    for name in args.formats:
        t = getattr(Q, name)
        cases.append((name, 640, 2048))
        cases.append((name, 2048, 1024 if t in Q.K_TYPES else 640))
    if not args.no_lm_head:
        cases.append(("Q8_0", 262144, 640))
    for name, n_out, n_in in cases:
        t = getattr(Q, name)
        nbytes = n_out * Q.row_bytes(t, n_in)
        reps = args.reps if nbytes < 64 * 2**20 else max(3, args.reps // 6)
        best = bench(t, n_out, n_in, reps, args.threads, args.cold_mb)
        rel = " ".join(f"{best[m] / best[1]:5.2f}" for m in MS[1:])
        print(
            f"{name:6s} {f'{n_out}x{n_in}':>13s} {nbytes / 2**20:7.2f} {best[1] * 1e6:9.1f} "
            f"{nbytes / best[1] / 1e9:6.1f}  {rel}",
            flush=True,
        )


if __name__ == "__main__":
    main()
