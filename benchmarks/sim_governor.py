"""The governor on simulated rounds: no model, only its decisions against known costs and acceptance.

Each round asks `SpeedGovernor.decide`, accepts each draft with probability P until the first rejection (the
report's controlled-acceptance shape), and records a duration: the round length's cost times the machine's current
load phase (a phase of 1.2-1.6x starts or ends with probability 1/40 a round), 5% half-normal jitter, a 1.5x stall
in 3% of the rounds, and a first-use cost the first time each length runs. One governor serves `--requests`
requests of `--tokens` tokens (as a LocalModel keeps it); the speedup of a request is the plain time of the same
tokens with the same load, jitter and stalls over its time. Prints, over the seeds, the median request's speedup,
the worst request's and the best fixed length's (no load, no first use), e.g. with the E2B round costs of
docs/report/avx512:

    python benchmarks/sim_governor.py 0.675 51.5 59.75 68.8 72.8 [--seeds 40] [--first-use-ms 200]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from cuca.speculative.governor import SpeedGovernor, expected_tokens


def request_speedups(p: float, costs: list[float], seed: int, requests: int, tokens: int,
                     first_use: float) -> list[float]:
    rng = np.random.default_rng(seed)
    gov, load, out = SpeedGovernor(), 1.0, []
    seen: set[int] = set()
    for _ in range(requests):
        emitted, spent, plain = 1, 0.0, 0.0
        while emitted < tokens:
            if rng.random() < 1 / 40:
                load = 1.0 if load > 1.0 else float(rng.uniform(1.2, 1.6))
            limit = min(len(costs) - 1, tokens - emitted - 1)
            k = gov.decide(limit) if limit > 0 else 0
            accepted = 0
            while accepted < k and rng.random() < p:
                accepted += 1
            # the same jitter and stalls for the plain steps of those tokens: only the first use is the drafter's
            slow = load * (1.0 + 0.05 * abs(float(rng.standard_normal()))) * (1.5 if rng.random() < 0.03 else 1.0)
            seconds = costs[k] * slow + (first_use if k not in seen else 0.0)
            seen.add(k)
            gov.record(k, accepted, seconds)
            spent += seconds
            plain += (accepted + 1) * costs[0] * slow
            emitted += accepted + 1
        out.append(plain / spent)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("p", type=float, help="probability that each draft is right")
    ap.add_argument("costs_ms", type=float, nargs="+", help="round cost (ms) with 0, 1, ... drafts")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--first-use-ms", type=float, default=200.0)
    a = ap.parse_args()
    costs = [c / 1e3 for c in a.costs_ms]
    runs = [request_speedups(a.p, costs, s, a.requests, a.tokens, a.first_use_ms / 1e3) for s in range(a.seeds)]
    med = statistics.median(statistics.median(r) for r in runs)
    worst = [min(r) for r in runs]
    best = max(range(len(costs)), key=lambda k: expected_tokens([a.p] * k, k) / costs[k])
    fixed = expected_tokens([a.p] * best, best) / costs[best] * costs[0]
    print(f"P {a.p}: governed, median request {med:.3f}x plain; worst request: median {statistics.median(worst):.3f}, "
          f"least {min(worst):.3f}; best fixed length {best}: {fixed:.3f}x ({a.seeds} seeds x {a.requests} requests)")


if __name__ == "__main__":
    main()
