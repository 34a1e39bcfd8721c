"""Draft-model speculation at real shapes (issue 18): a Qwen3-0.6B-shaped Q8_0 drafter for a Qwen3-8B-shaped Q4_0
target (tools/synth_dense.py: random quantized blocks, written once under ~/.cache/cuca-synth-dense), both in cuca and
in llama.cpp's native build (benchmarks/peer/build_llamacpp.sh), interleaved in one run, medians.

    python benchmarks/bench_draft_model.py [--threads 2] [--tokens 32] [--reps 3] [--out draft_model.json]

Reported: the round's parts in both engines, interleaved (a target step, a 4-row verify pass, a draft step;
llama.cpp's from llama-bench pp1/pp4) and the speedup they give at each P (modelled); plain decode tok/s (cuca vs
llama-bench tg); one draft-model step as a fraction of one target step (cuca: single-token forward + head of each,
best of reps; llama.cpp: the ratio of its tg rates); cuca's speedup at controlled acceptance P = 0.5, 0.7, 0.85 per
draft (the real draft model runs, its drafts replaced by the target's own tokens with probability P: synthetic
weights never agree), draft_tokens 3, plain and speculative runs interleaved; llama.cpp's own draft-model
speculation (llama-speculative-simple -md, --spec-type draft-simple) on the same pair, at the acceptance the random
weights give, and its speedup at the same P MODELLED from its round and plain-step costs of this run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import synth_dense  # noqa: E402

from cuca import DrafterSource  # noqa: E402
from cuca.bench.core import Bench, Workload, expected_rate, median, run_curve, spread  # noqa: E402
from cuca.bench.llama import modelled_speedup  # noqa: E402
from cuca.bench.peer import find_peer  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. The story begins"
LEVELS = (0.5, 0.7, 0.85)
N_DRAFT = 3


def step_ms(model: Any, cache: Any, prompt: list[int], reps: int) -> float:
    """Best time (ms) of one single-token forward (logits of that row) after `prompt`."""
    best = float("inf")
    for _ in range(reps):
        cache.reset()
        model.forward(np.array(prompt, np.int32), np.arange(len(prompt), dtype=np.int32), cache)
        t0 = time.perf_counter()
        model.forward(np.array([prompt[-1]], np.int32), np.array([len(prompt)], np.int32), cache)
        best = min(best, (time.perf_counter() - t0) * 1e3)
    cache.reset()
    return best


def pass_ms(model: Any, cache: Any, prompt: list[int], m: int) -> float:
    """Wall ms of one m-row pass (logits of every row, as a verify pass) after `prompt`."""
    cache.reset()
    model.forward(np.array(prompt, np.int32), np.arange(len(prompt), dtype=np.int32), cache)
    t0 = time.perf_counter()
    model.forward(np.full(m, prompt[-1], np.int32), np.arange(len(prompt), len(prompt) + m, dtype=np.int32), cache,
                  "all")
    out = (time.perf_counter() - t0) * 1e3
    cache.reset()
    return out


def modelled(step_ms: float, draft_ms: float, verify_ms: float) -> dict[str, float]:
    """Speedup at each P: E[tokens per round] x plain step / (N_DRAFT draft steps + one (N_DRAFT+1)-row verify)."""
    return {str(p): (1 + sum(p**i for i in range(1, N_DRAFT + 1))) * step_ms / (N_DRAFT * draft_ms + verify_ms)
            for p in LEVELS}


def costs(b: Bench, peer: Any, ids: list[int], reps: int, paths: tuple[Path, Path]) -> dict[str, Any]:
    """The round's parts in both engines, interleaved (medians of `reps`): a target step, an (N_DRAFT+1)-row verify
    pass, a draft step; and the speedup each engine's parts give at each P (modelled)."""
    drafter: Any = b.lm.drafter
    m = N_DRAFT + 1
    c: dict[str, list[float]] = {"step": [], "verify": [], "draft": [], "l_step": [], "l_verify": [], "l_draft": []}
    for _ in range(reps):
        c["step"].append(pass_ms(b.lm.model, b.lm.engine.cache, ids, 1))
        c["verify"].append(pass_ms(b.lm.model, b.lm.engine.cache, ids, m))
        c["draft"].append(pass_ms(drafter.model, drafter.cache, ids, 1))
        if peer is not None:
            ms = peer.pass_ms(paths[0], [1, m], 1)["ms"]
            c["l_step"].append(ms["1"])
            c["l_verify"].append(ms[str(m)])
            c["l_draft"].append(peer.pass_ms(paths[1], [1], 1)["ms"]["1"])
    med = {k: median(v) for k, v in c.items() if v}
    out: dict[str, Any] = {"ms": med, "ranges": {k: spread(v) for k, v in c.items() if v},
                           "cuca_modelled": modelled(med["step"], med["draft"], med["verify"])}
    if peer is not None:
        out["llama_modelled"] = modelled(med["l_step"], med["l_draft"], med["l_verify"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=Path("~/.cache/cuca-synth-dense").expanduser())
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--costs-only", action="store_true", help="only the round's parts and the modelled speedups")
    a = ap.parse_args()
    tgt, dft = synth_dense.pair_files(a.folder)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    b = Bench(tgt, drafter=DrafterSource.file(dft), draft_tokens=N_DRAFT, threads=a.threads, n_ctx=512)
    peer = find_peer(a.threads)
    ids = b.encode(PROMPT)
    res: dict[str, Any] = {"target": str(tgt), "drafter": str(dft), "threads": a.threads, "tokens": a.tokens,
                           "reps": a.reps, "loadavg_start": os.getloadavg(), "prompt_tokens": len(ids)}

    res["costs"] = costs(b, peer, ids, a.reps, (tgt, dft))
    log(f"costs: {res['costs']}")
    if a.costs_only:
        print(json.dumps(res, indent=2, default=float))
        return

    # plain decode, cuca and llama.cpp interleaved
    ours, theirs = [], []
    for r in range(a.reps):
        ours.append(b.plain(ids, a.tokens).tps)
        if peer is not None:
            theirs += peer.decode(tgt, a.tokens)["samples_tps"]
        log(f"plain rep {r}: cuca {ours[-1]:.3f} tok/s, llama.cpp {theirs[-1] if theirs else None}")
    res["plain"] = {"cuca_tps": median(ours), "cuca_range": spread(ours),
                    "llama_tps": median(theirs) if theirs else None, "llama_range": spread(theirs) if theirs else None,
                    "cuca_over_llama": median(ours) / median(theirs) if theirs else None}

    # one draft step over one target step
    drafter: Any = b.lm.drafter
    t_ms = step_ms(b.lm.model, b.lm.engine.cache, ids, a.reps)
    d_ms = step_ms(drafter.model, drafter.cache, ids, a.reps)
    res["step"] = {"cuca_target_ms": t_ms, "cuca_draft_ms": d_ms, "cuca_fraction": d_ms / t_ms}
    if peer is not None:
        dt = median(peer.decode(dft, a.tokens)["samples_tps"])
        tt = median(theirs)
        res["step"].update(llama_draft_tps=dt, llama_fraction=tt / dt)
    log(f"step: {res['step']}")

    # controlled acceptance
    curve = run_curve(b, [PROMPT], LEVELS, Workload(a.tokens, a.reps), N_DRAFT, log)
    res["curve"] = curve

    # llama.cpp's own draft-model speculation on the pair, and its modelled speedup at the same P
    if peer is not None:
        runs = [peer.speculative(tgt, "draft-simple", PROMPT, a.tokens, N_DRAFT, dft) for _ in range(a.reps)]
        round_ms = median([r["round_ms"] for r in runs])
        plain_ms = 1e3 / median(theirs)
        res["llama_spec"] = {"tps": median([r["tps"] for r in runs]), "round_ms": round_ms, "plain_ms": plain_ms,
                             "acceptance_rate": runs[0]["acceptance_rate"], "source": runs[0]["source"],
                             "modelled": {str(p): modelled_speedup(1 + sum(p**i for i in range(1, N_DRAFT + 1)),
                                                                   round_ms, plain_ms) for p in LEVELS},
                             "expected_acceptance": {str(p): expected_rate(p, N_DRAFT) for p in LEVELS}}
        log(f"llama.cpp spec: {res['llama_spec']}")
    res["loadavg_end"] = os.getloadavg()
    text = json.dumps(res, indent=2, default=float)
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
