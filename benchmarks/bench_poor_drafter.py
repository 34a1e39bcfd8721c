"""Issue 6 item 3 on its own: a drafter whose drafts are never accepted (the real drafter runs, its proposals are
replaced by wrong tokens), governed, against plain decoding of the same request, interleaved in one run after the
kept governor has warmed up (it measures, turns drafting off and lengthens its probe interval).

    python benchmarks/bench_poor_drafter.py MODEL DRAFTER [--threads 2] [--reps 6] [--tokens 128] [--start-probe-ab]

e.g. `/work/bench/qwen35-0.8b-synth-q8_0.gguf in-trunk`, or the Gemma 4 E2B pair from bench_gemma4.py.
`--start-probe-ab` also runs a second kept governor without the probe at each request's start, interleaved (order
alternating), and prints both against plain and their paired ratio: what that probe costs a hopeless drafter.
"""

from __future__ import annotations

import argparse

import numpy as np

from cuca.bench import Bench, Controlled
from cuca.speculative.governor import SpeedGovernor

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("drafter")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--start-probe-ab", action="store_true")
    a = ap.parse_args()
    if a.start_probe_ab:
        start_probe_ab(a)
        return
    b = Bench(a.model, a.drafter, 3, a.threads, n_ctx=1024)
    x = b.encode(PROMPT)
    ref = b.plain(x, a.tokens).tokens
    governor = SpeedGovernor()
    for w in range(4):
        b.spec(x, a.tokens, governor, control=Controlled(0.0, ref, w))
    mark = governor.event_count
    plain, gov = [], []
    for rep in range(a.reps):
        plain.append(b.plain(x, a.tokens).tps)
        gov.append(b.spec(x, a.tokens, governor, control=Controlled(0.0, ref, 100 + rep)).tps)
    print(f"plain    tok/s {[round(v, 2) for v in plain]}")
    print(f"governed tok/s {[round(v, 2) for v in gov]}")
    print(f"governed / plain (medians): {np.median(gov) / np.median(plain):.3f}; governor events while timed: "
          f"{governor.events_since(mark)}")


class NoStartProbe(SpeedGovernor):
    """The governor without the probe at a request's start (its schedule's probes only)."""

    def begin_request(self) -> None:
        pass


def start_probe_ab(a: argparse.Namespace) -> None:
    b = Bench(a.model, a.drafter, 3, a.threads, n_ctx=1024)
    x = b.encode(PROMPT)
    ref = b.plain(x, a.tokens).tokens
    govs = {"start probe": SpeedGovernor(), "none": NoStartProbe()}
    for g in govs.values():
        for w in range(4):
            b.spec(x, a.tokens, g, control=Controlled(0.0, ref, w))
    ratio: dict[str, list[float]] = {name: [] for name in govs}
    for rep in range(a.reps):
        p = b.plain(x, a.tokens).tps
        for name in list(govs) if rep % 2 == 0 else list(govs)[::-1]:
            ratio[name].append(b.spec(x, a.tokens, govs[name], control=Controlled(0.0, ref, 100 + rep)).tps / p)
    paired = [s / n for s, n in zip(ratio["start probe"], ratio["none"], strict=True)]
    print(f"governed / plain, medians of {a.reps} pairs: with the request-start probe "
          f"{np.median(ratio['start probe']):.4f}, without {np.median(ratio['none']):.4f}; "
          f"with / without (paired) {np.median(paired):.4f}")


if __name__ == "__main__":
    main()
