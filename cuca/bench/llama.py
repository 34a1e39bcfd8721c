"""llama.cpp on the same files, through its own native build (peer.py), measured in the same run as cuca's figures
and interleaved with them: plain decode, M-row pass costs, its own speculation on the same pair, and its speedup at
a chosen acceptance modelled from costs measured in this run (labelled "modelled"). Every figure has a source."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .core import PASS_TOKEN, PROMPTS, Bench, Log, Workload, _quiet, _rnd, median, spread
from .peer import BUILD_SCRIPT, Peer, PeerError, find_peer, spec_type_for


def cuca_pass_ms(b: Bench, prompt: list[int], ms: Sequence[int], reps: int, logits: str = "all") -> dict[int, float]:
    """Best time (ms) of one M-row forward pass after the prompt; logits "all" (a verify pass) or "last"."""
    eng = b.lm.engine
    cache = eng.cache
    best = dict.fromkeys(ms, float("inf"))
    tok = min(PASS_TOKEN, int(b.lm.model.n_vocab) - 1)
    for _ in range(reps):
        for m in ms:  # the sizes take turns, so machine load hits them alike
            cache.reset()
            eng.prefill(prompt)
            toks, pos = np.full(m, tok, np.int32), np.arange(cache.n, cache.n + m, dtype=np.int32)
            t0 = time.perf_counter()
            eng.model.forward(toks, pos, cache, logits)
            best[m] = min(best[m], (time.perf_counter() - t0) * 1e3)
    cache.reset()
    return best


def modelled_speedup(tokens_per_round: float, round_ms: float, plain_ms: float) -> float:
    """Speculative over plain throughput when a round (its drafts + one verify) costs round_ms and yields
    `tokens_per_round` tokens, and a plain step costs plain_ms."""
    return tokens_per_round * plain_ms / round_ms


def _drafter_file(b: Bench) -> Path | None:
    ds = b.lm.drafter_source
    return Path(ds.source.resolve()) if ds is not None and ds.kind == "file" and ds.source is not None else None


def _spec_runs(peer: Peer, b: Bench, stype: str, texts: Sequence[str], n: int, log: Log) -> dict[str, Any]:
    runs = []
    for text in texts:
        runs.append(peer.speculative(b.path, stype, text, n, b.draft_tokens, _drafter_file(b)))
    acc, dr = sum(r["n_accept"] for r in runs), sum(r["n_drafted"] for r in runs)
    out = {"spec_tps": _rnd(median([r["tps"] for r in runs]), 2), "spec_tps_range": spread([r["tps"] for r in runs]),
           "round_ms": _rnd(median([r["round_ms"] for r in runs]), 3), "n_draft": b.draft_tokens,
           "acceptance_rate": _rnd(acc / dr if dr else None), "drafted": dr, "accepted": acc,
           "tokens_per_round": _rnd(sum(r["decoded"] for r in runs) / sum(r["rounds"] for r in runs)),
           "spec_type": stype, "source": runs[0]["source"] if runs else None}
    log(f"  llama.cpp spec ({stype}): {out['spec_tps']} tok/s, acceptance {out['acceptance_rate']}")
    return out


PASS_REPS = 5  # repetitions of each M-row pass (the best is kept)


def run_llama(b: Bench, prompts: dict[str, list[str]], work: Workload, ms: Sequence[int],
              probe: Callable[[], dict[str, Any]] | None = None, log: Log = _quiet) -> dict[str, Any]:
    """llama.cpp's native build on the same file, interleaved with cuca plain runs: plain decode (llama-bench tg, one
    figure: it decodes no prompt, so a category would only repeat it), per category its own speculation on the same
    pair (where it has a counterpart of the drafter); the cost of M-row passes. `probe` (the read bandwidth) runs
    right before each cuca / llama.cpp pair of plain runs: `paired_reads` keeps the three figures together."""
    reps, max_tokens = work.reps, work.max_tokens
    peer = find_peer(b.threads)
    if peer is None:
        return {"skipped": f"no native llama.cpp build (run {BUILD_SCRIPT}, or set CUCA_LLAMA_BIN)"}
    stype = spec_type_for(b.drafter_kind)
    try:
        cats: dict[str, Any] = {}
        plain_src = spec_note = None
        plain: list[float] = []
        cuca_plain: list[float] = []
        paired: list[dict[str, float]] = []  # a read bandwidth sample, then cuca's and llama.cpp's plain decode
        for cat, texts in prompts.items():
            for _ in range(reps):
                for text in texts:
                    read = probe() if probe is not None else {}
                    cuca_plain.append(b.plain(b.encode(text), max_tokens).tps)
                    d = peer.decode(b.path, max_tokens)
                    plain += d["samples_tps"]
                    plain_src = d["source"]
                    if read.get("gbs"):
                        paired.append({"read_gbs": read["gbs"], "cuca_tps": round(cuca_plain[-1], 3),
                                       "llama_tps": round(d["samples_tps"][0], 3)})
            c: dict[str, Any] = {}
            if stype is not None and spec_note is None:
                try:
                    c.update(_spec_runs(peer, b, stype, texts, max_tokens, log))
                except PeerError as e:  # this llama.cpp version may not run the pair
                    spec_note = f"llama-speculative-simple --spec-type {stype} could not run this pair: {e}"[:400]
            cats[cat] = c
        plain_tps = median(plain)
        for c in cats.values():
            if c.get("spec_tps"):
                c["speedup"] = _rnd(c["spec_tps"] / plain_tps)
        log(f"  llama.cpp plain (llama-bench tg{max_tokens}): {plain_tps:6.2f} tok/s")
        theirs = peer.pass_ms(b.path, ms, PASS_REPS)
    except PeerError as e:
        return {"skipped": f"llama.cpp (native) could not run {b.path.name}: {e}"[:500], "peer": peer.info()}
    prompt = b.encode(PROMPTS["prose"][0])
    ours = cuca_pass_ms(b, prompt, ms, PASS_REPS)
    ours_last = cuca_pass_ms(b, prompt, ms, PASS_REPS, "last")
    pm = {"llama.cpp": {m: round(float(v), 3) for m, v in theirs["ms"].items()},
          "cuca": {str(m): round(v, 3) for m, v in ours.items()},
          "cuca (last row's logits)": {str(m): round(v, 3) for m, v in ours_last.items()}}
    rounds = [c for c in cats.values() if c.get("round_ms")]
    return {
        "plain": {"label": f"tg{max_tokens}", "plain_tps": _rnd(plain_tps, 2), "plain_tps_range": spread(plain),
                  "cuca_plain_tps_same_time": _rnd(median(cuca_plain), 2),
                  "cuca_over_llama_plain": _rnd(median(cuca_plain) / plain_tps), "source": plain_src,
                  "paired_reads": paired},
        "categories": cats, "peer": peer.info(), "spec_skipped": spec_note if stype else
        f"llama.cpp has no counterpart of the {b.drafter_kind} drafter here",
        "spec_round_ms": _rnd(median([c["round_ms"] for c in rounds]), 3) if rounds else None,
        "plain_step_ms": _rnd(1e3 / plain_tps, 3),
        "pass_ms": pm,
        "pass_cost": {who: {m: round(v / t["1"], 3) for m, v in t.items()} for who, t in pm.items() if "1" in t},
        "provenance": {"llama.cpp pass_ms": theirs["source"],
                       "cuca pass_ms": "cuca forward of M rows after the prose prompt, logits for every row (a "
                                       "verify pass) and for the last row only; best of the same repetitions",
                       "llama.cpp plain_tps": plain_src, "spec": rounds[0]["source"] if rounds else spec_note},
    }


def llama_at_acceptance(llama: dict[str, Any], tokens_per_round: float, n: int) -> dict[str, Any] | None:
    """llama.cpp's speedup at `tokens_per_round`, MODELLED from its round cost (llama-speculative-simple, n drafts
    per round) and plain step (llama-bench) measured in this run; None when either was not measured."""
    round_ms, plain_ms = llama.get("spec_round_ms"), llama.get("plain_step_ms")
    n_draft = next((c.get("n_draft") for c in llama.get("categories", {}).values() if c.get("n_draft")), None)
    if round_ms is None or plain_ms is None or n_draft != n:
        return None
    return {"tokens_per_round": round(tokens_per_round, 3), "modelled": True,
            "speedup": round(modelled_speedup(tokens_per_round, round_ms, plain_ms), 3),
            "round_ms": round_ms, "plain_ms": plain_ms,
            "source": f"modelled: tokens/round x plain step ms / round ms; round ms of llama-speculative-simple "
                      f"(n_draft {n}) and plain step of llama-bench tg, both measured in this run"}
