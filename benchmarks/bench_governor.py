"""The governor against fixed round lengths and plain decoding, interleaved in one process (issue 15 item 6).

Per repetition and category: plain, governed (one SpeedGovernor kept across every request, as a LocalModel keeps
it), and drafting every round at each fixed length, at a controlled acceptance (default: the published level of the
target's architecture; synthetic weights are never right on their own). Then a drafter that is never right
(P = 0): governed vs plain after a few warm-up requests. Medians of tokens/s; the load average is printed.

    python benchmarks/bench_governor.py TARGET DRAFTER [--threads 2] [--reps 3] [--tokens 64] [--lengths 2 3]
        [--draft-tokens 3] [--probability P] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

from cuca.bench import PROMPTS, AlwaysDraft, Bench, Controlled, Run, published_probability
from cuca.kernels import ISA
from cuca.speculative.governor import SpeedGovernor


def med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def one(b: Bench, name: str, x: list[int], gov: SpeedGovernor, ctl: Controlled, tokens: int) -> Run:
    """One request of contender `name`: "plain", "governed" (the kept governor), or "every round n=N"."""
    if name == "plain":
        return b.plain(x, tokens)
    if name == "governed":
        return b.spec(x, tokens, gov, control=ctl)
    return b.spec(x, tokens, AlwaysDraft(), draft_tokens=int(name.rsplit("=", 1)[1]), control=ctl)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("drafter")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft-tokens", type=int, default=3, help="the governor's maximum round length")
    ap.add_argument("--lengths", type=int, nargs="*", default=[2, 3], help="fixed lengths drafted every round")
    ap.add_argument("--probability", type=float, default=None, help="controlled P per draft (default: published)")
    ap.add_argument("--poor-warmup", type=int, default=4)
    ap.add_argument("--poor-reps", type=int, default=None, help="never-right pairs timed (default: --reps)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    load0 = os.getloadavg()
    b = Bench(a.target, a.drafter, a.draft_tokens, a.threads)
    p = a.probability if a.probability is not None else published_probability(b.arch, 3)
    if p is None:
        raise SystemExit(f"no published acceptance for {b.arch}: give --probability")
    cats = {c: b.encode(t[0]) for c, t in PROMPTS.items()}
    refs = {c: b.plain(x, a.tokens).tokens for c, x in cats.items()}  # also warms the caches up
    gov = SpeedGovernor()
    names = ["plain", "governed"] + [f"every round n={n}" for n in a.lengths]
    tps: dict[str, dict[str, list[float]]] = {c: {n: [] for n in names} for c in cats}
    ratios: dict[str, dict[str, list[float]]] = {c: {n: [] for n in names} for c in cats}  # over the same rep's plain
    depths: dict[str, list[int]] = {c: [] for c in cats}
    for rep in range(a.reps):
        for c, x in cats.items():  # --reps 0: the never-right drafter only
            ctl = Controlled(p, refs[c], 100 * rep)
            order = names[rep % len(names):] + names[: rep % len(names)]  # the order turns: load hits all alike
            runs = {n: one(b, n, x, gov, ctl, a.tokens) for n in order}
            for n in names:
                r = runs[n]
                assert r.tokens == refs[c], f"{n} differs from plain decoding on {c}"
                tps[c][n].append(r.tps)
                ratios[c][n].append(r.tps / runs["plain"].tps)
            st = runs["governed"].stats
            for k, count in enumerate(st.rounds_per_depth if st is not None else []):
                depths[c] += [0] * (k + 1 - len(depths[c]))
                depths[c][k] += count
            print(f"rep {rep + 1} {c:5s} " + "  ".join(f"{n} {v[-1]:.2f}" for n, v in tps[c].items()), flush=True)
    x = b.encode(PROMPTS["list"][0])
    ref = b.plain(x, a.tokens).tokens
    poor = SpeedGovernor()
    for w in range(a.poor_warmup):
        b.spec(x, a.tokens, poor, control=Controlled(0.0, ref, w))
    mark = poor.event_count
    pp, pg = [], []
    for rep in range(a.reps if a.poor_reps is None else a.poor_reps):
        for who in ("plain", "governed") if rep % 2 == 0 else ("governed", "plain"):  # which runs first alternates
            if who == "plain":
                pp.append(b.plain(x, a.tokens).tps)
            else:
                pg.append(b.spec(x, a.tokens, poor, control=Controlled(0.0, ref, 1000 + rep)).tps)
        print(f"never-right rep {rep + 1}: plain {pp[-1]:.2f} governed {pg[-1]:.2f}", flush=True)
    out: dict[str, Any] = {"isa": ISA, "threads": b.threads, "probability": round(p, 4), "tokens": a.tokens,
                           "reps": a.reps, "load_average_start": load0, "load_average_end": os.getloadavg(),
                           "categories": {}, "governor": gov.summary(),
                           "governor_events": [list(e) for e in gov.events]}
    print(f"\n== {b.path.name} + {b.drafter_name}  ISA {ISA}  threads {b.threads}  P = {p:.3f}  {a.tokens} tokens x "
          f"{a.reps} reps, interleaved; load average {load0} -> {os.getloadavg()}")
    print("tok/s medians (x plain: median over the repetitions of each run over the same repetition's plain run)")
    print(f"{'category':8s} " + " ".join(f"{n:>18s}" for n in names) + "   governed rounds per length k=0..")
    for c in cats:
        out["categories"][c] = {n: {"tps": round(med(v), 2), "x_plain": round(med(ratios[c][n]), 3),
                                    "range": [round(min(v), 2), round(max(v), 2)] if v else []}
                                for n, v in tps[c].items()}
        out["categories"][c]["governed_rounds_per_depth"] = depths[c]
        print(f"{c:8s} " + " ".join(f"{med(tps[c][n]):7.2f} ({med(ratios[c][n]):5.2f}x)".rjust(18) for n in names)
              + f"   {depths[c]}")
    every = {n: [r for c in cats for r in ratios[c][n]] for n in names}
    out["all_categories_x_plain"] = {n: round(med(v), 3) for n, v in every.items()}
    print(f"{'all':8s} " + " ".join(f"({med(every[n]):5.2f}x)".rjust(18) for n in names))
    ratio = med([g / q for g, q in zip(pg, pp, strict=True)])
    out["never_right"] = {"plain_tps": round(med(pp), 2), "governed_tps": round(med(pg), 2), "ratio": round(ratio, 3),
                          "warmup_requests": a.poor_warmup,
                          "events_timed": [list(e) for e in poor.events_since(mark)]}
    print(f"never-right drafter (P=0), governed vs plain after {a.poor_warmup} warm-up requests, {len(pp)} pairs: "
          f"{med(pg):.2f} vs {med(pp):.2f} tok/s (medians; {med(pg) / med(pp):.3f}x), median of the pairs' ratios "
          f"{ratio:.3f}x; decisions while timed {[tuple(e) for e in poor.events_since(mark)]}")
    print(f"governor model: {gov.summary()}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
