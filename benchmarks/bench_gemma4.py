"""Gemma 4 E2B at its real shapes (synthetic weights: Q4_0 layers, Q6_K embeddings, as llama-quantize writes a Q4_0
file) and its gemma4-assistant drafter (F16 file, stored as Q8_0 in memory): plain decode tokens/s of cuca and
llama.cpp side by side in one run, the cost of an M-row verify pass (logits for every row) relative to one row,
and one drafter step as a fraction of one target step.

    python benchmarks/bench_gemma4.py [--folder /tmp/cuca-bench] [--threads 2] [--tokens 32] [--reps 3]

The files (about 3.3 GB) are written once into --folder by tests/synth_gemma4.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_decode import cuca_decode, cuca_pass, fmt

from cuca.bench import find_peer
from cuca.engine import Engine
from cuca.gguf import open_gguf
from cuca.kernels import ISA
from cuca.models import load_model
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from synth_gemma4 import e2b_files  # noqa: E402

MS = (1, 2, 4, 8)


def drafter_step(eng: Engine, assistant: Any, prompt: list[int], reps: int) -> float:
    cache = eng.cache
    cache.reset()
    h = eng.model.forward_hidden(np.array(prompt, np.int32), np.arange(len(prompt), dtype=np.int32), cache)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        assistant.step(np.array([1000], np.int32), h[-1:], len(prompt), cache)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=Path("/tmp/cuca-bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-llama", action="store_true")
    a = ap.parse_args()
    tgt, dft = e2b_files(a.folder)
    eng = Engine(load_model(open_gguf(tgt), Ops(a.threads)), 1024)
    assistant = load_assistant(open_gguf(dft), eng.model.ops, eng.model)
    prompt = [int(t) for t in np.random.default_rng(0).integers(300, 5000, 16)]
    peer = None if a.no_llama else find_peer(a.threads)  # llama.cpp's native build (benchmarks/peer/)
    cuca_decode(eng, prompt, 4)
    ours, theirs = [], []
    for _ in range(a.reps):  # interleaved
        ours.append(cuca_decode(eng, prompt, a.tokens))
        if peer is not None:
            theirs += peer.decode(tgt, a.tokens)["samples_tps"]
    print(f"== {tgt.name}  threads={a.threads}  ISA {ISA}  {a.tokens} tokens x {a.reps} reps")
    if peer is not None:
        print(f"llama.cpp: {peer.info()}")
    line = f"decode tok/s   cuca {fmt(ours)}"
    if theirs:
        ratio = statistics.median(ours) / statistics.median(theirs)
        line += f"   llama.cpp (native llama-bench tg{a.tokens}) {fmt(theirs)}   cuca/llama.cpp {ratio:.2f}x"
    print(line)
    rows = [("cuca", lambda m: cuca_pass(eng, prompt, m, "all", a.reps * 2))]
    if peer is not None:
        pm = peer.pass_ms(tgt, MS, a.reps * 2)["ms"]
        rows.append(("llama.cpp", lambda m: pm[str(m)] / 1e3))  # llama-bench pp M: the last row's logits
    print("pass vs M=1 (cuca: logits for every row)   " + "  ".join(f"M={m}" for m in MS))
    step = {}
    for label, fn in rows:
        times = {m: fn(m) for m in MS}
        step[label] = times[1]
        costs = "  ".join(f"{times[m] / times[1]:4.2f}" for m in MS)
        print(f"  {label:10s} {costs}   (M=1: {times[1] * 1e3:.1f} ms)")
    d = drafter_step(eng, assistant, prompt, a.reps * 4)
    print(f"drafter step {d * 1e3:.1f} ms = {d / step['cuca']:.3f} of a cuca target step")


if __name__ == "__main__":
    main()
