"""Qwen 3.5 0.8B shapes (synthetic Q8_0 weights, real layout, MTP head included), cuca and llama.cpp side by side:
plain decode tokens/s, a verify pass of 4 rows (logits for every row) against a 1-row step, and one MTP draft
step (head over the first 65,536 ids) against a target step.

    python benchmarks/bench_qwen35.py [--threads 2] [--path FILE] [--n-decode 32] [--reps 5] [--no-llama]

The file is generated on the first run (tools/synth_qwen35.py, about 0.9 GB, a minute or two) and reused.
llama.cpp runs from its native build (benchmarks/peer/build_llamacpp.sh): llama-bench tg, and pp1 / pp4 (the last
row's logits, from an empty context), measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35 as S  # noqa: E402

from cuca.gguf import open_gguf  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402
from cuca.speculative.drafters.mtp import DRAFT_VOCAB  # noqa: E402

DEFAULT = Path("/tmp/qwen35-0.8b-synth-q8_0.gguf")


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def bench_cuca(path: Path, threads: int, n_decode: int, reps: int, prompt: np.ndarray) -> dict[str, float]:
    model = load_model(open_gguf(path), Ops(threads))
    n_ctx = len(prompt) + n_decode + 8 * reps + 64
    cache = model.make_cache(n_ctx)
    n = len(prompt)
    model.forward(prompt, np.arange(n, dtype=np.int32), cache)
    tok = int(prompt[-1])
    model.forward(np.array([tok], np.int32), np.array([n], np.int32), cache)  # warm-up
    pos = n + 1
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = model.forward(np.array([tok], np.int32), np.array([pos], np.int32), cache)
        tok = int(np.argmax(logits[0])) % 65536
        pos += 1
    decode_s = (time.perf_counter() - t0) / n_decode
    one, four, back = [], [], []
    for _ in range(reps):
        ids = np.array([tok, 11, 12, 13], np.int32)
        t0 = time.perf_counter()
        model.head(model.forward_hidden(ids[:1], np.array([pos], np.int32), cache))
        one.append(time.perf_counter() - t0)
        cache.trim(0)
        t0 = time.perf_counter()
        model.head(model.forward_hidden(ids, np.arange(pos + 1, pos + 5, dtype=np.int32), cache))
        four.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cache.trim(3)  # reject 3 drafts: restore the snapshot
        back.append(time.perf_counter() - t0)
        pos += 2
    mcache = model.make_mtp_cache(n_ctx)
    h = np.random.default_rng(0).standard_normal((pos, model.c.n_embd)).astype(np.float32)
    model.mtp_forward(np.arange(pos, dtype=np.int32) % 1000, h, np.arange(pos, dtype=np.int32), mcache)
    draft = []
    hh = h[-1:]
    for i in range(reps * 3):
        t0 = time.perf_counter()
        hh = model.mtp_forward(np.array([17], np.int32), hh, np.array([pos + i], np.int32), mcache)
        model.mtp_logits(hh, DRAFT_VOCAB)
        draft.append(time.perf_counter() - t0)
    return {"decode_s": decode_s, "one_s": med(one), "four_s": med(four), "draft_s": med(draft),
            "trim_s": med(back)}


def bench_llama(path: Path, threads: int, n_decode: int, reps: int) -> dict[str, Any] | str:
    """llama.cpp's native build (benchmarks/peer/build_llamacpp.sh): llama-bench tg and pp1 / pp4, this run, and
    which build that is (Peer.info())."""
    from cuca.bench import PeerError, find_peer

    peer = find_peer(threads)
    if peer is None:
        return "no native llama.cpp build (benchmarks/peer/build_llamacpp.sh)"
    try:
        tps = peer.decode(path, n_decode, reps)["samples_tps"]
        pm = peer.pass_ms(path, [1, 4], reps)["ms"]
    except PeerError as e:
        return f"llama.cpp could not run the file: {e}"
    return {"decode_s": 1 / med(tps), "one_s": pm["1"] / 1e3, "four_s": pm["4"] / 1e3, "peer": peer.info()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--path", type=Path, default=DEFAULT)
    ap.add_argument("--n-decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-llama", action="store_true")
    a = ap.parse_args()
    if not a.path.exists():
        t0 = time.perf_counter()
        print(f"writing {a.path} (real 0.8B shapes, Q8_0) ...", flush=True)
        S.write(a.path, S.REAL_0_8B, qtype=S.Q.Q8_0, seed=0)
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    prompt = np.random.default_rng(1).integers(0, 65536, 32).astype(np.int32)
    c = bench_cuca(a.path, a.threads, a.n_decode, a.reps, prompt)
    gc.collect()
    ll = None if a.no_llama else bench_llama(a.path, a.threads, a.n_decode, a.reps)
    from cuca.kernels import ISA

    print(f"\nqwen35 0.8B synthetic Q8_0, {a.threads} threads, cuca ISA {ISA}")
    print(f"{'':28}{'cuca':>12}{'llama.cpp':>12}")

    def row(name: str, cv: str, lv: str) -> None:
        print(f"{name:28}{cv:>12}{lv:>12}")

    lld = ll if isinstance(ll, dict) else None
    row("decode tokens/s", f"{1 / c['decode_s']:.1f}", f"{1 / lld['decode_s']:.1f}" if lld else "-")
    row("1-row step ms", f"{1e3 * c['one_s']:.1f}", f"{1e3 * lld['one_s']:.1f}" if lld else "-")
    row("4-row verify ms", f"{1e3 * c['four_s']:.1f}", f"{1e3 * lld['four_s']:.1f}" if lld else "-")
    row("verify 4 / 1 row", f"{c['four_s'] / c['one_s']:.2f}x", f"{lld['four_s'] / lld['one_s']:.2f}x" if lld else "-")
    row("rollback of 3 rows ms", f"{1e3 * c['trim_s']:.1f}", "-")
    row("MTP draft step ms", f"{1e3 * c['draft_s']:.1f}", "-")
    row("draft / target step", f"{c['draft_s'] / c['one_s']:.3f}x", "-")
    if isinstance(ll, str):
        print(f"llama.cpp: {ll}")
    elif lld is not None:
        print(f"llama.cpp: {lld['peer']}")


if __name__ == "__main__":
    main()
