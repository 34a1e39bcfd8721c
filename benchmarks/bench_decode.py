"""Plain decode tokens/s, cuca vs llama.cpp (llama-cpp-python) side by side in one run, same file and threads;
and the cost of one M-row forward pass relative to M = 1 (the verify sizes of speculative decoding).

    python benchmarks/bench_decode.py [--model PRESET_OR_PATH ...] [--threads 2] [--tokens 64] [--reps 5]

Runs alternate cuca / llama.cpp so that both see the same machine load; medians with (min-max) are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

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


def llama_decode(llm: Any, prompt: list[int], n: int) -> tuple[float, float]:
    """(wall tok/s through llama-cpp-python, tok/s by llama.cpp's own eval timer: its engine alone)."""
    import llama_cpp

    llm.reset()
    llm.eval(prompt)
    n_vocab = llm.n_vocab()
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    t0 = time.perf_counter()
    for _ in range(n):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        llm.eval([int(np.argmax(logits))])
    wall = n / (time.perf_counter() - t0)
    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
    return wall, perf.n_eval / (perf.t_eval_ms / 1e3)


def cuca_pass(eng: Engine, prompt: list[int], m: int, logits: str, reps: int) -> float:
    """Best-of time (s) of one m-row forward after the prompt."""
    model, cache = eng.model, eng.cache
    cache.reset()
    eng.prefill(prompt)
    n0 = cache.n
    toks = np.full(m, 1000, np.int32)
    pos = np.arange(n0, n0 + m, dtype=np.int32)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward(toks, pos, cache, logits)
        best = min(best, time.perf_counter() - t0)
        cache.trim(m)
    return best


def llama_pass(llm: Any, prompt: list[int], m: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        llm.reset()
        llm.eval(prompt)
        t0 = time.perf_counter()
        llm.eval([1000] * m)
        best = min(best, time.perf_counter() - t0)
    return best


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
    llama_cpp = None
    if not a.no_llama:
        import llama_cpp  # type: ignore[no-redef]
    for name in a.model:
        path = ModelSource.parse(name).resolve()
        eng = Engine(load_model(open_gguf(path), Ops(a.threads)), 512)
        prompt = [int(t) for t in np.random.default_rng(0).integers(300, 5000, PROMPT_IDS_LEN)]
        llm = None
        if llama_cpp is not None:
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=a.threads, verbose=False)
        ours, theirs, theirs_engine = [], [], []
        cuca_decode(eng, prompt, 8)  # warm up page cache and threads
        if llm is not None:
            llama_decode(llm, prompt, 8)
        for _ in range(a.reps):
            ours.append(cuca_decode(eng, prompt, a.tokens))
            if llm is not None:
                wall, engine = llama_decode(llm, prompt, a.tokens)
                theirs.append(wall)
                theirs_engine.append(engine)
        print(f"\n== {path.name}  threads={a.threads}  {a.tokens} tokens x {a.reps} reps")
        print(f"decode tok/s   cuca {fmt(ours)}", end="")
        if theirs:
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"   llama.cpp {fmt(theirs)}   cuca/llama.cpp {ratio:.2f}x", end="")
        print()
        if theirs_engine:
            ratio = statistics.median(ours) / statistics.median(theirs_engine)
            print(f"   llama.cpp engine timer only (no Python) {fmt(theirs_engine)}   cuca/that {ratio:.2f}x")
        print("pass cost vs M=1    " + "  ".join(f"M={m:<2d}" for m in (1, 2, 4, 8, 16)))
        passes: list[tuple[str, Any]] = [
            ("cuca (all logits)", lambda m, e=eng, p=prompt: cuca_pass(e, p, m, "all", a.reps * 2)),
            ("cuca (last logits)", lambda m, e=eng, p=prompt: cuca_pass(e, p, m, "last", a.reps * 2)),
        ]
        if llm is not None:
            passes.append(("llama.cpp (last)", lambda m, lm=llm, p=prompt: llama_pass(lm, p, m, a.reps * 2)))
        for label, fn in passes:
            times = {m: fn(m) for m in (1, 2, 4, 8, 16)}
            print(f"{label:19s} " + "  ".join(f"{times[m] / times[1]:4.2f}" for m in (1, 2, 4, 8, 16))
                  + f"   (M=1: {times[1] * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
