"""llama.cpp through llama-cpp-python on the same files: plain decode, M-row pass costs, and its speculative
speedup modelled from measured verify and draft costs."""


from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..speculative.drafters.prompt_lookup import PromptLookupDrafter
from ..speculative.stats import RequestDraftStats
from .core import (
    ANCHOR_DRAFT_MS,
    ANCHOR_ITERATION_MS,
    PASS_TOKEN,
    PROMPTS,
    PUBLISHED_DRAFT_TOKENS,
    SUSPECT_PASS_COST,
    Bench,
    Log,
    Run,
    _draft_summary,
    _quiet,
    _rnd,
    median,
    spread,
)


def llama_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except Exception:
        return False
    return True


class LlamaRunner:
    """llama.cpp through llama-cpp-python, driven like cuca: greedy arg-max over logits it returns for every row,
    the same prompt-lookup drafter, a verify pass of [fed, *drafts] and a cache trim after a rejection."""

    def __init__(self, path: Path, threads: int, n_ctx: int = 512):
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                                   logits_all=True, verbose=False)

    def _row(self, i: int) -> np.ndarray:
        return np.asarray(self.llm.scores[i])

    def generate(self, prompt: list[int], n: int, draft_tokens: int = 0) -> tuple[float, list[int], RequestDraftStats]:
        """(decode tokens/s after the first token, tokens, draft stats); draft_tokens > 0 drafts by prompt lookup."""
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        out = [int(np.argmax(self._row(llm.n_tokens - 1)))]
        drafter = PromptLookupDrafter() if draft_tokens else None
        if drafter is not None:
            drafter.begin(prompt)
            drafter.commit([*prompt[1:], out[0]], np.arange(len(prompt)))
        stats = RequestDraftStats()
        t0 = time.perf_counter()
        while len(out) < n:
            k = min(draft_tokens, n - len(out) - 1)
            drafts = list(drafter.propose(k).tokens[:k]) if drafter is not None and k > 0 else []
            base = llm.n_tokens
            llm.eval([out[-1], *drafts])
            preds = [int(np.argmax(self._row(base + i))) for i in range(len(drafts) + 1)]
            acc = 0
            while acc < len(drafts) and drafts[acc] == preds[acc]:
                acc += 1
            if acc < len(drafts):
                llm.n_tokens = base + 1 + acc
                llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
            if drafts:
                stats.record_round(len(drafts), acc)
            new = drafts[:acc] + [preds[acc]]
            out += new
            if drafter is not None:
                drafter.commit(new, np.arange(base, base + len(new)))
        dt = time.perf_counter() - t0
        out = out[:n]
        return (len(out) - 1) / dt if dt > 0 else 0.0, out, stats

    def pass_ms(self, prompt: list[int], ms: Sequence[int], reps: int) -> dict[int, float]:
        """Best time (ms) of one M-row pass after the prompt, logits for every row (as a verify pass needs)."""
        llm = self.llm
        best = dict.fromkeys(ms, float("inf"))
        tok = min(PASS_TOKEN, llm.n_vocab() - 1)
        for _ in range(reps):
            for m in ms:  # the sizes take turns, so machine load hits them alike
                llm.reset()
                llm.eval(prompt)
                t0 = time.perf_counter()
                llm.eval([tok] * m)
                best[m] = min(best[m], (time.perf_counter() - t0) * 1e3)
        return best

    def close(self) -> None:
        self.llm.close()
        del self.llm
        gc.collect()


def cuca_pass_ms(b: Bench, prompt: list[int], ms: Sequence[int], reps: int) -> dict[int, float]:
    """Best time (ms) of one M-row forward pass after the prompt, logits for every row (a verify pass)."""
    eng = b.lm.engine
    cache = eng.cache
    best = dict.fromkeys(ms, float("inf"))
    tok = min(PASS_TOKEN, int(b.lm.model.n_vocab) - 1)
    for _ in range(reps):
        for m in ms:
            cache.reset()
            eng.prefill(prompt)
            toks, pos = np.full(m, tok, np.int32), np.arange(cache.n, cache.n + m, dtype=np.int32)
            t0 = time.perf_counter()
            eng.model.forward(toks, pos, cache, "all")
            best[m] = min(best[m], (time.perf_counter() - t0) * 1e3)
    cache.reset()
    return best


def modelled_speedup(tokens_per_round: float, verify_ms: float, plain_ms: float, draft_ms: float, n: int) -> float:
    """Speculative over plain throughput when a round (n draft steps + one (n+1)-row verify) yields
    `tokens_per_round` tokens and a plain step costs plain_ms."""
    return tokens_per_round * plain_ms / (verify_ms + n * draft_ms)


def run_llama(b: Bench, prompts: dict[str, list[str]], reps: int, max_tokens: int, ms: Sequence[int],
              pass_reps: int = 5, log: Log = _quiet) -> dict[str, Any]:
    """llama.cpp on the same file: per category plain decode (and prompt-lookup speculation with the same drafter,
    when the bench's drafter is prompt lookup), interleaved with cuca plain runs; the cost of M-row passes."""
    if not llama_available():
        return {"skipped": "llama-cpp-python is not installed"}
    try:
        lr = LlamaRunner(b.path, b.threads)
    except Exception as e:  # the file's architecture or the vendored llama.cpp may not support it
        return {"skipped": f"llama.cpp could not load {b.path.name}: {e}"}
    try:
        spec = b.drafter_kind == "prompt_lookup"
        cats: dict[str, Any] = {}
        for cat, texts in prompts.items():
            plain, sp, cuca_plain, runs = [], [], [], []
            for _ in range(reps):
                for text in texts:
                    ids = b.encode(text)
                    cuca_plain.append(b.plain(ids, max_tokens).tps)
                    tps, want, _ = lr.generate(ids, max_tokens)
                    plain.append(tps)
                    if spec:
                        stps, got, st = lr.generate(ids, max_tokens, b.draft_tokens)
                        sp.append(stps)
                        runs.append(Run(stps, got, st))
            c: dict[str, Any] = {"plain_tps": _rnd(median(plain), 2), "plain_tps_range": spread(plain),
                                 "cuca_plain_tps_same_time": _rnd(median(cuca_plain), 2),
                                 "cuca_over_llama_plain": _rnd(median(cuca_plain) / median(plain))}
            if spec:
                c.update({"spec_tps": _rnd(median(sp), 2), "spec_tps_range": spread(sp),
                          "speedup": _rnd(median(sp) / median(plain)), **_draft_summary(runs)})
            cats[cat] = c
            log(f"  llama.cpp {cat:5s}: plain {median(plain):6.2f} tok/s" +
                (f", spec {median(sp):6.2f} tok/s" if spec else ""))
        prompt = b.encode(PROMPTS["prose"][0])
        theirs = lr.pass_ms(prompt, ms, pass_reps)
    finally:
        lr.close()
    ours = cuca_pass_ms(b, prompt, ms, pass_reps)
    suspect = theirs.get(2, 0.0) > SUSPECT_PASS_COST * theirs[1]
    return {
        "categories": cats,
        "pass_suspect": (f"llama.cpp's 2-row pass took {theirs.get(2, 0.0) / theirs[1]:.1f}x its 1-row pass: the "
                         "llama-cpp-python build's multi-row path is pathological on this machine (native llama-bench "
                         "measured 1.1-1.5x, perf-anchor.md section 3); its computed speedups are not comparable")
        if suspect else None,
        "pass_ms": {"llama.cpp": {str(m): round(v, 3) for m, v in theirs.items()},
                    "cuca": {str(m): round(v, 3) for m, v in ours.items()}},
        "pass_cost": {"llama.cpp": {str(m): round(v / theirs[1], 3) for m, v in theirs.items()},
                      "cuca": {str(m): round(v / ours[1], 3) for m, v in ours.items()}},
        "driver": "llama-cpp-python, logits for every row, greedy arg-max in Python as in cuca's loop",
    }


def anchor_at_acceptance(arch: str, tokens_per_round: float, n: int = PUBLISHED_DRAFT_TOKENS) -> float | None:
    """llama.cpp's speedup at `tokens_per_round` from perf-anchor.md's native-build iteration costs (n = 3 only)."""
    a = ANCHOR_ITERATION_MS.get(arch)
    if a is None or n != PUBLISHED_DRAFT_TOKENS:
        return None
    return round(modelled_speedup(tokens_per_round, a[0], a[2], a[1], n), 3)


def llama_at_acceptance(arch: str, llama: dict[str, Any], tokens_per_round: float, n: int) -> dict[str, Any] | None:
    """llama.cpp's speculative speedup at `tokens_per_round`, from its measured 1-row and (n+1)-row passes and the
    anchor's draft-step cost (as a fraction of a plain step)."""
    anchor = ANCHOR_DRAFT_MS.get(arch)
    pm = llama.get("pass_ms", {}).get("llama.cpp", {})
    if anchor is None or "1" not in pm or str(n + 1) not in pm:
        return None
    plain, verify = pm["1"], pm[str(n + 1)]
    draft = anchor[0] / anchor[1] * plain
    return {"tokens_per_round": round(tokens_per_round, 3), "speedup": round(
        modelled_speedup(tokens_per_round, verify, plain, draft, n), 3), "plain_ms": plain, "verify_ms": verify,
        "draft_ms": round(draft, 3), "draft_cost_source": f"perf-anchor.md section 7: {anchor[0]} ms per draft step "
        f"over a {anchor[1]} ms plain step, scaled to the plain step measured now"}


# ---- the whole bench of one pair ----------------------------------------------------------------------------------
