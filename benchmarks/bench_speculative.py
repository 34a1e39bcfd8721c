"""Speculative throughput over plain decoding, per prompt category (code, list, prose), 128-token greedy replies,
plain and speculative runs interleaved in one process. Default: Gemma 3 270M (from PyPI) with prompt lookup.

    python benchmarks/bench_speculative.py [--model PRESET_OR_PATH] [--threads 2] [--draft-tokens 3] [--reps 3]
        [--json OUT.json]

Each speculative request shares one governor per run (as a LocalModel does); `--no-governor` drafts every round.
Token ids are asserted equal between plain and speculative runs (greedy decoding must not change).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's cuca, not an installed one

from cuca.bench import PROMPTS, AlwaysDraft  # noqa: E402  (the prompts `cuca bench` uses)
from cuca.engine import Engine, Generation  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402
from cuca.sampling import SamplingParams  # noqa: E402
from cuca.sources import ModelSource  # noqa: E402
from cuca.speculative import Governor, RequestDraftStats, SpeculativeDecoder, SpeedGovernor  # noqa: E402
from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402
from cuca.tokenizer import Tokenizer  # noqa: E402


def run(eng: Engine, prompt: list[int], n: int, spec: SpeculativeDecoder | None) -> tuple[list[int], float]:
    gen = Generation()
    t0 = time.perf_counter()
    toks = list(eng.stream(prompt, n, SamplingParams(), frozenset(), gen, spec))
    return toks, n / (time.perf_counter() - t0 - gen.timings.prompt_s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m-q4_k_m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-governor", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    f = open_gguf(ModelSource.parse(a.model).resolve())
    tok = Tokenizer.from_gguf(f)
    eng = Engine(load_model(f, Ops(a.threads)), 1024)
    governor: Governor = AlwaysDraft() if a.no_governor else SpeedGovernor()
    report: dict = {"model": f.path.name, "threads": a.threads, "draft_tokens": a.draft_tokens, "categories": {}}
    print(f"{f.path.name}  threads={a.threads}  draft_tokens={a.draft_tokens}  {a.tokens} tokens x {a.reps} reps")
    print(f"{'category':8s} {'plain tok/s':>12s} {'spec tok/s':>12s} {'speedup':>8s} {'accept':>7s} {'tok/round':>9s}")
    for cat, texts in PROMPTS.items():
        plain_tps, spec_tps, stats = [], [], RequestDraftStats()
        for _ in range(a.reps):
            for text in texts:
                ids = tok.encode(text)
                want, tps = run(eng, ids, a.tokens, None)
                plain_tps.append(tps)
                s = SpeculativeDecoder(eng.model, eng.cache, PromptLookupDrafter(), governor, a.draft_tokens)
                got, tps = run(eng, ids, a.tokens, s)
                assert got == want, f"speculative output differs from plain on {text[:30]!r}"
                spec_tps.append(tps)
                stats.rounds += s.stats.rounds
                stats.drafted += s.stats.drafted
                stats.accepted += s.stats.accepted
        p, q = statistics.median(plain_tps), statistics.median(spec_tps)
        rate = stats.acceptance_rate()
        tpr = stats.tokens_per_round()
        report["categories"][cat] = {
            "plain_tps": round(p, 2), "spec_tps": round(q, 2), "speedup": round(q / p, 3),
            "acceptance_rate": None if rate is None else round(rate, 3),
            "tokens_per_round": None if tpr is None else round(tpr, 3),
            "plain_tps_range": [round(min(plain_tps), 2), round(max(plain_tps), 2)],
            "spec_tps_range": [round(min(spec_tps), 2), round(max(spec_tps), 2)],
        }
        print(f"{cat:8s} {p:12.1f} {q:12.1f} {q / p:7.2f}x {(rate or 0):7.0%} {(tpr or 0):9.2f}")
    if isinstance(governor, SpeedGovernor):
        report["governor_events"] = [list(e) for e in governor.events]
        report["governor"] = governor.summary()
        print(f"governor decisions (kind, round, length): {[tuple(e) for e in governor.events]}")
        print(f"governor model: {governor.summary()}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
