"""The E2B assistant's draft step with its dense tied head vs its centroid head (2048 centroids, top 32: logits for
4096 of 262,144 ids), at the real shapes (synthetic weights, tests/synth_gemma4.py `e2b_files`; the centroid
variant adds random centroids and a random token ordering to the same drafter file). Same run, interleaved, medians;
each also as a fraction of one target decode step. `--cpu-time` times the process's CPU time instead of the wall
clock (use with --threads 1 on a loaded machine: preemption then does not count).

    python benchmarks/bench_centroid_head.py [--folder /tmp/cuca-bench] [--threads 2] [--reps 15] [--cpu-time]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from synth_gemma4 import E2B, append_centroids, e2b_files  # noqa: E402

N_CENTROIDS = 2048


def centroid_variant(dft: Path) -> Path:
    out = dft.with_name(dft.stem + "-centroids.gguf")
    if not out.exists():
        rng = np.random.default_rng(5)
        centroids = rng.standard_normal((N_CENTROIDS, 256)).astype(np.float32) / 16
        append_centroids(dft, out.with_suffix(".tmp"), centroids, rng.permutation(E2B.n_vocab))
        out.with_suffix(".tmp").rename(out)
    return out


def timed(fn: Any, clock: Any = time.perf_counter) -> float:
    t0 = clock()
    fn()
    return (clock() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=Path("/tmp/cuca-bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cpu-time", action="store_true")
    a = ap.parse_args()
    clock = time.process_time if a.cpu_time else time.perf_counter
    tgt, dft = e2b_files(a.folder)
    target = load_model(open_gguf(tgt), Ops(a.threads))
    dense = load_assistant(open_gguf(dft), target.ops, target)
    masked = load_assistant(open_gguf(centroid_variant(dft)), target.ops, target)
    assert dense.centroid_head is None and masked.centroid_head is not None
    cache = target.make_cache(1024)
    prompt = np.array(np.random.default_rng(0).integers(300, 5000, 32), np.int32)
    h = target.forward_hidden(prompt[:-1], np.arange(len(prompt) - 1, dtype=np.int32), cache)[-1:]
    pos, tok = len(prompt) - 1, np.array([1000], np.int32)
    n0 = cache.n

    def target_step() -> None:
        target.forward(prompt[-1:], np.array([pos], np.int32), cache)
        cache.trim(cache.n - n0)

    runs: dict[str, list[float]] = {"target step": [], "dense draft step": [], "centroid draft step": []}
    for _ in range(2):  # warm-up
        dense.step(tok, h, pos, cache), masked.step(tok, h, pos, cache), target_step()
    for _ in range(a.reps):
        runs["dense draft step"].append(timed(lambda: dense.step(tok, h, pos, cache), clock))
        runs["centroid draft step"].append(timed(lambda: masked.step(tok, h, pos, cache), clock))
        runs["target step"].append(timed(target_step, clock))
    med = {k: statistics.median(v) for k, v in runs.items()}
    what = "process CPU time" if a.cpu_time else "wall clock"
    print(f"== E2B real shapes, threads={a.threads}, {a.reps} interleaved reps, medians of {what} (machine shared)")
    for k, v in runs.items():
        print(f"{k:<20} {med[k]:8.2f} ms  (min {min(v):.2f}, max {max(v):.2f})  "
              f"= {med[k] / med['target step']:.3f} of a target step")
    print(f"dense / centroid     {med['dense draft step'] / med['centroid draft step']:.2f}x")


if __name__ == "__main__":
    main()
