"""Plain decode tokens/s, cuca vs llama.cpp's native build (benchmarks/peer/build_llamacpp.sh: llama-bench tg)
side by side in one run, same file and threads; the read bandwidth now and each engine's achieved GB/s; and the
cost of one M-row forward pass relative to M = 1 (the verify sizes of speculative decoding; llama-bench pp M).

    python benchmarks/bench_decode.py [--model PRESET_OR_PATH ...] [--threads 2] [--tokens 64] [--reps 5]

Runs alternate cuca / llama.cpp so that both see the same machine load; medians with (min-max) are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from cuca.bench import find_peer, read_bandwidth, weight_bytes_per_token
from cuca.bench.bandwidth import achieved
from cuca.engine import Engine
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.sources import ModelSource

PROMPT_IDS_LEN = 16


def cuca_decode(eng: Engine, prompt: list[int], n: int) -> float:
    model, cache = eng.model, eng.cache
    cache.reset()
    logits = eng.prefill(prompt)
    pos = len(prompt)
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(logits))
        logits = model.forward(np.array([tok], np.int32), np.array([pos], np.int32), cache, "last")[0]
        pos += 1
    return n / (time.perf_counter() - t0)


def cuca_pass(eng: Engine, prompt: list[int], m: int, logits: str, reps: int) -> float:
    """Best-of time (s) of one m-row forward after the prompt."""
    model, cache = eng.model, eng.cache
    cache.reset()
    eng.prefill(prompt)
    n0 = cache.n
    toks = np.full(m, 1000, np.int32)
    pos = np.arange(n0, n0 + m, dtype=np.int32)
    best = float("inf")
    snap = cache.snapshot() if hasattr(cache, "snapshot") else None  # a recurrent state cannot trim a whole batch
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward(toks, pos, cache, logits)
        best = min(best, time.perf_counter() - t0)
        if snap is not None:
            cache.restore(snap)
        else:
            cache.trim(m)
    return best


def _gbs(per_tok: int, tps: float, bw: dict[str, Any]) -> str:
    a = achieved(per_tok, tps, bw.get("gbs"))
    frac = a["of_read_bandwidth"]
    return f"{a['gbs']:.1f} GB/s" + (f" ({frac:.0%} of read)" if frac else "")


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="*", default=["smollm2-135m-instruct-q4_1", "gemma3-270m-q4_k_m"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp (cuca figures only)")
    a = ap.parse_args()
    peer = None if a.no_llama else find_peer(a.threads)
    if peer is None and not a.no_llama:
        print("no native llama.cpp build: run benchmarks/peer/build_llamacpp.sh (llama.cpp figures skipped)")
    if peer is not None:
        print(f"llama.cpp: {peer.info()}")
    bw = read_bandwidth(a.threads)
    print(f"read bandwidth now, {a.threads} threads: {bw.get('gbs', bw.get('skipped'))} GB/s")
    for name in a.model:
        path = ModelSource.parse(name).resolve()
        eng = Engine(load_model(open_gguf(path), Ops(a.threads)), 512)
        prompt = [int(t) for t in np.random.default_rng(0).integers(300, 5000, PROMPT_IDS_LEN)]
        ours, theirs = [], []
        cuca_decode(eng, prompt, 8)  # warm up page cache and threads
        for _ in range(a.reps):  # interleaved: both engines see the same load
            ours.append(cuca_decode(eng, prompt, a.tokens))
            if peer is not None:
                theirs += peer.decode(path, a.tokens)["samples_tps"]
        per_tok = weight_bytes_per_token(path)
        print(f"\n== {path.name}  threads={a.threads}  {a.tokens} tokens x {a.reps} reps  "
              f"{per_tok / 1e6:.1f} MB of weights per token")
        print(f"decode tok/s   cuca {fmt(ours)} = {_gbs(per_tok, statistics.median(ours), bw)}", end="")
        if theirs:
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"\n   llama.cpp (llama-bench tg{a.tokens}) {fmt(theirs)} = "
                  f"{_gbs(per_tok, statistics.median(theirs), bw)}   cuca/llama.cpp {ratio:.2f}x", end="")
        print()
        print("pass cost vs M=1    " + "  ".join(f"M={m:<2d}" for m in (1, 2, 4, 8, 16)))
        passes: list[tuple[str, Any]] = [
            ("cuca (all logits)", lambda m, e=eng, p=prompt: cuca_pass(e, p, m, "all", a.reps * 2)),
            ("cuca (last logits)", lambda m, e=eng, p=prompt: cuca_pass(e, p, m, "last", a.reps * 2)),
        ]
        if peer is not None:
            pm = peer.pass_ms(path, (1, 2, 4, 8, 16), a.reps * 2)["ms"]
            passes.append(("llama.cpp (last)", lambda m, t=pm: t[str(m)] / 1e3))
        for label, fn in passes:
            times = {m: fn(m) for m in (1, 2, 4, 8, 16)}
            print(f"{label:19s} " + "  ".join(f"{times[m] / times[1]:4.2f}" for m in (1, 2, 4, 8, 16))
                  + f"   (M=1: {times[1] * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
