"""Decode and M-row pass cost with the machine quiet and with one core busy (another process spinning on the last
CPU), cuca and the native llama.cpp build side by side, interleaved, in one run (issue 15: no pass may cost more
than M times a 1-row pass with a second process busy).

    python benchmarks/bench_contention.py [--model PRESET_OR_PATH] [--threads 2] [--tokens 24] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench_decode import PROMPT_IDS_LEN, cuca_decode, cuca_pass

from cuca.bench import find_peer
from cuca.engine import Engine
from cuca.gguf import open_gguf
from cuca.kernels import ISA
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.sources import ModelSource

MS = (1, 2, 4, 8)


def busy_core() -> subprocess.Popen:
    """A process spinning on the last CPU this process may use."""
    cpu = max(os.sched_getaffinity(0))
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m-q4_k_m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    path = ModelSource.parse(a.model).resolve()
    eng = Engine(load_model(open_gguf(path), Ops(a.threads)), 256)
    prompt = list(range(10, 10 + PROMPT_IDS_LEN))
    peer = find_peer(a.threads)
    print(f"{path.name}  cuca ISA {ISA}  threads={a.threads}  load {os.getloadavg()[0]:.2f}  "
          f"llama.cpp: {peer.info() if peer else 'none (benchmarks/peer/build_llamacpp.sh)'}")
    res: dict[str, dict[str, list[float]]] = {c: {"cuca": [], "llama": []} for c in ("quiet", "busy")}
    costs: dict[str, list[dict[int, float]]] = {"quiet": [], "busy": []}
    for _ in range(a.reps):
        for cond in ("quiet", "busy"):
            spin = busy_core() if cond == "busy" else None
            try:
                time.sleep(0.3 if spin else 0)
                res[cond]["cuca"].append(cuca_decode(eng, prompt, a.tokens))
                p = {m: cuca_pass(eng, prompt, m, "last", 5) for m in MS}
                costs[cond].append({m: p[m] / p[1] for m in MS})
                if peer is not None:
                    res[cond]["llama"].append(statistics.median(peer.decode(path, a.tokens)["samples_tps"]))
            finally:
                if spin is not None:
                    spin.kill()
                    spin.wait()
    for cond in ("quiet", "busy"):
        c, ll = res[cond]["cuca"], res[cond]["llama"]
        line = f"{cond:5}  decode tok/s  cuca {statistics.median(c):6.1f} ({min(c):.1f}-{max(c):.1f})"
        if ll:
            line += f"   llama.cpp tg{a.tokens} {statistics.median(ll):6.1f} ({min(ll):.1f}-{max(ll):.1f})"
        print(line)
        worst = {m: max(r[m] for r in costs[cond]) for m in MS}
        med = {m: statistics.median(r[m] for r in costs[cond]) for m in MS}
        print("       cuca pass cost vs M=1 (last logits), median / worst: "
              + "  ".join(f"M={m} {med[m]:.2f}/{worst[m]:.2f}" for m in MS[1:]))
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
