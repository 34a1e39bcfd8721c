"""Matmul kernel timings per weight format at decode-sized batches.

For every format and a few realistic shapes (gemma-3-270m's: 640x2048, 2048x640 (2048x1024 for the K formats,
whose rows must be multiples of 256) and the 262144x640 Q8_0 LM head), time out = x @ W^T at M = 1, 2, 4, 8,
16, 17 rows of x and print the time at M=1, the weight bandwidth it implies, and the cost of each M relative
to M=1.

Hot (default): the best of --reps calls on one weight tensor, which then sits in the caches.
--cold-mb N: sweep over enough copies of each weight tensor to stream N MB per sweep, so the weights come from
memory as in a real forward pass (the median call counts).

    python benchmarks/bench_kernels.py --threads 2 --cold-mb 1024
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads must not spin on our cores

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from quant_data import random_weight  # noqa: E402

from cuca import quants as Q  # noqa: E402
from cuca.kernels import ISA, impl  # noqa: E402

FORMATS = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
MS = [1, 2, 4, 8, 16, 17]


def weight(wtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Random weights; big tensors repeat a random 4096-row slab (the kernels cannot tell)."""
    if n_out <= 4096:
        return random_weight(wtype, n_out, n_in)
    slab = random_weight(wtype, 4096, n_in)
    return np.tile(slab, (n_out // 4096, 1))


def bench(wtype: int, n_out: int, n_in: int, reps: int, threads: int, cold_mb: float) -> dict[int, float]:
    """Seconds per call for each M. Hot: the best of `reps` calls, the M values taking turns (so that load from
    elsewhere hits them alike). Cold: the median over two sweeps of the weight copies."""
    w = weight(wtype, n_out, n_in)
    copies = max(1, int(np.ceil(cold_mb * 2**20 / w.nbytes))) if cold_mb > 0 else 1
    ws = [w] + [w.copy() for _ in range(copies - 1)]
    rng = np.random.default_rng(0)
    xs = {M: rng.standard_normal((M, n_in), dtype=np.float32) for M in MS}
    outs = {M: np.empty((M, n_out), np.float32) for M in MS}

    def call(wi: np.ndarray, M: int) -> float:
        t0 = time.perf_counter()
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP threads (0: all)")
    ap.add_argument("--reps", type=int, default=30, help="calls per point; the best one counts")
    ap.add_argument("--cold-mb", type=float, default=0.0, help="MB of weights streamed per round")
    ap.add_argument("--formats", nargs="*", default=FORMATS)
    ap.add_argument("--no-lm-head", action="store_true", help="skip the 262144x640 Q8_0 shape")
    args = ap.parse_args()

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
