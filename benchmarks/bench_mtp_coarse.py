"""The drafters' coarse ranking (a Q4_0 copy of the draft head, the best 8 rescored by the head itself) against the
head alone, in one process: per repetition and setting a plain request, then a speculative one drafting every round
and one under that setting's kept governor, at controlled acceptance (the published level for the file's
architecture). Prints each request's speculative / plain ratio and the medians.

    python benchmarks/bench_mtp_coarse.py [FILE] [--drafter DRAFTER] [--threads 2] [--reps 5] [--tokens 96]

FILE: a Qwen 3.5 GGUF with an MTP head (the in-trunk drafter; default: the report's real-shape synthetic file,
written by benchmarks/report.py into /tmp/cuca-bench), or a Gemma 4 target with its assistant as DRAFTER (the
assistant's dense head: /tmp/cuca-bench/gemma4-e2b-synthetic-q4_0.gguf with
/tmp/cuca-bench/gemma4-e2b-assistant-synthetic-f16.gguf).
"""

from __future__ import annotations

import argparse
import statistics

from cuca.bench.core import Bench, Controlled, published_probability
from cuca.speculative.governor import AlwaysDraft, SpeedGovernor

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", default="/tmp/cuca-bench/qwen35-0.8b-synth-q8_0.gguf")
    ap.add_argument("--drafter", default="in-trunk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    b = Bench(a.file, a.drafter, draft_tokens=3, threads=a.threads)
    drafter = b.lm.drafter
    assistant = getattr(drafter, "assistant", None)  # the Gemma 4 assistant, else the MTP drafter
    rough = getattr(assistant, "coarse_embd", None)
    if (rough is None) if assistant is not None else not drafter.coarse:
        raise SystemExit(f"{a.file}: no coarse copy of the draft head (small head, or a backend without one)")

    def use_coarse(on: bool) -> None:
        if assistant is not None:
            assistant.coarse_embd = rough if on else None
        else:
            drafter.coarse = on

    ids = b.encode(PROMPT)
    reference = b.plain(ids, a.tokens).tokens
    p = published_probability(b.arch)
    if p is None:
        raise SystemExit(f"no published acceptance level for {b.arch}")
    governors = {True: SpeedGovernor(), False: SpeedGovernor()}
    ratios: dict[tuple[bool, str], list[float]] = {(c, g): [] for c in (True, False) for g in ("every", "governed")}
    for rep in range(a.reps):
        for coarse in (True, False):
            use_coarse(coarse)
            for g in ("every", "governed"):
                plain = b.plain(ids, a.tokens)
                spec = b.spec(ids, a.tokens, AlwaysDraft() if g == "every" else governors[coarse],
                              control=Controlled(p, reference, seed=rep))
                if spec.tokens != reference:
                    raise SystemExit("speculative output differs from plain decoding")
                ratios[(coarse, g)].append(spec.tps / plain.tps)
                print(f"rep {rep + 1} {'coarse' if coarse else 'head  '} {g:8s} plain {plain.tps:6.2f} tok/s  "
                      f"spec {spec.tps:6.2f} tok/s  {spec.tps / plain.tps:.3f}x", flush=True)
    print(f"P = {p:.3f} per draft, {a.threads} threads, {a.reps} pairs per setting")
    for (coarse, g), v in ratios.items():
        print(f"{'coarse' if coarse else 'head  '} {g:8s} median {statistics.median(v):.3f}x  "
              f"({min(v):.3f}-{max(v):.3f})")


if __name__ == "__main__":
    main()
