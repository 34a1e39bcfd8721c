"""`cuca bench`: is speculative decoding faster, and than what?

For a target (+ drafter), greedy 128-token replies to prompts in three categories (code, list, prose), plain and
speculative runs interleaved in one process, several repetitions. Reported: tokens/s medians with their spread,
the speedup per category, acceptance rate and mean tokens per round, the governor's decisions, and llama.cpp's
figures on the same file (through llama-cpp-python) where it can run them.

Controlled acceptance (for files whose weights are synthetic, where a real drafter is never right): the drafter's
real computation runs, then each proposed token is replaced by the target's own next token with probability P
(taken from a plain greedy run of the same prompt), else by a token that is certainly wrong. At draft_tokens n the
expected acceptance rate is then (P + P^2 + ... + P^n) / n, because a round stops at its first wrong draft.

Sections (each optional): categories (the table), a sweep of tokens/s over draft_tokens, a speedup-vs-acceptance
curve (controlled), a poorly-accepted drafter run with the governor against plain decoding (issue 6 item 3), and
llama.cpp: plain decode, the cost of an M-row verify pass, prompt-lookup speculation with the same drafter, and its
speedup at a given acceptance computed from its verify and draft costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .engine import Generation, Speculation
from .sampling import SamplingParams
from .speculative.drafters import Drafter
from .speculative.drafters.prompt_lookup import PromptLookupDrafter
from .speculative.governor import Governor
from .speculative.proposal import Proposal
from .speculative.stats import RequestDraftStats

CATEGORIES = ("code", "list", "prose")

# Prompts per category (raw text, continued greedily). Code: edits and repetitive structure that a drafter can
# copy; list: enumerations; prose: open-ended text, where drafting pays least.
PROMPTS: dict[str, list[str]] = {
    "code": [
        "Rename the variable `total` to `acc` in this function:\n\ndef sum_list(xs):\n    total = 0\n"
        "    for x in xs:\n        total += x\n    return total\n\nAnswer:\n\ndef sum_list(xs):\n",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
        "class Queue:\n    def __init__(self):\n",
        "Add type hints to this function.\n\ndef scale(points, factor):\n    out = []\n    for x, y in points:\n"
        "        out.append((x * factor, y * factor))\n    return out\n\nWith type hints:\n\n",
    ],
    "list": [
        "Months of the year:\n1. January\n2. February\n3. March\n4.",
        "Shopping list: apples, bananas, bread, milk, eggs. Repeat the shopping list as bullet points:\n-",
        "The planets of the solar system, in order from the Sun:\n1. Mercury\n2. Venus\n3.",
    ],
    "prose": [
        "Once upon a time, in a small village by the sea, there lived",
        "The history of the printing press begins",
        "Write a short paragraph about why people enjoy walking in the mountains.\n\n",
    ],
}

# Published acceptance levels at draft_tokens 3 (issue 8), per target architecture.
PUBLISHED: dict[str, dict[str, float]] = {
    "gemma4": {"acceptance_rate": 0.48},  # Gemma 4 E2B assistant: about 48 % of drafts accepted
    "qwen35": {"tokens_per_round": 2.7},  # Qwen 3.5 0.8B MTP head: about 2.7 tokens per round
}
PUBLISHED_DRAFT_TOKENS = 3
# The product page's speedups (measured on 32 cores), per architecture and category.
PRODUCT_PAGE: dict[str, dict[str, float]] = {
    "gemma4": {"code": 1.17, "list": 1.37, "prose": 1.00},
    "qwen35": {"code": 1.62, "list": 1.18, "prose": 0.98},
}
# llama.cpp's MTP draft cost on this machine (shared/specs/perf-anchor.md section 7, t=2, n_draft 3): ms per draft
# step and ms per plain step, measured together; llama-cpp-python cannot run these drafters, so the draft cost used
# for llama.cpp is this ratio times the plain step measured now.
PASS_TOKEN = 1000  # the token fed M times in a timed M-row pass

ANCHOR_DRAFT_MS: dict[str, tuple[float, float]] = {"gemma4": (9.1, 55.7), "qwen35": (14.3, 46.7)}
# The same section's full iteration at n_draft 3, measured with llama.cpp's own native build (llama-speculative-simple
# and llama-completion): (verify ms of the 4-row batch, draft ms per step, plain step ms). A second estimate of
# llama.cpp's speedup that does not depend on the llama-cpp-python wheel's multi-row path.
ANCHOR_ITERATION_MS: dict[str, tuple[float, float, float]] = {"gemma4": (137.1, 9.1, 55.7),
                                                               "qwen35": (102.3, 14.3, 46.7)}
SUSPECT_PASS_COST = 4.0  # a 2-row pass costing more than this many 1-row passes is not a sane measurement


# ---- numbers ------------------------------------------------------------------------------------------------------
def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> list[float]:
    return [round(min(xs), 2), round(max(xs), 2)] if xs else []


def expected_rate(p: float, n: int) -> float:
    """Expected acceptance rate (accepted / drafted) when each draft is right with probability p, n per round."""
    return sum(p**i for i in range(1, n + 1)) / n


def probability_for(n: int = PUBLISHED_DRAFT_TOKENS, acceptance_rate: float | None = None,
                    tokens_per_round: float | None = None) -> float:
    """The per-draft probability P that yields an acceptance rate (or mean tokens per round) at n drafts."""
    if (acceptance_rate is None) == (tokens_per_round is None):
        raise ValueError("give exactly one of acceptance_rate, tokens_per_round")
    target = acceptance_rate if acceptance_rate is not None else (float(tokens_per_round or 1.0) - 1.0) / n
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"acceptance rate {target} is not in [0, 1]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_rate(mid, n) < target else (lo, mid)
    return (lo + hi) / 2


def published_probability(arch: str, n: int = PUBLISHED_DRAFT_TOKENS) -> float | None:
    level = PUBLISHED.get(arch)
    return None if level is None else probability_for(n, **level)


# ---- drafting stand-ins ---------------------------------------------------------------------------------------------
class ControlledDrafter:
    """Wraps a drafter: its real computation runs, then each proposed token is replaced by the target's own next
    token with probability `probability`, else by the drafter's token when that is wrong, else by a wrong one. Call
    `expect(prompt_len, reference, seed)` before each request with the target's greedy continuation."""

    def __init__(self, inner: Drafter, probability: float, seed: int = 0):
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {probability}")
        self.inner, self.probability = inner, probability
        self.uses_hidden = inner.uses_hidden
        self.rng = np.random.default_rng(seed)
        self.prompt_len = 0
        self.reference: list[int] = []

    def expect(self, prompt_len: int, reference: Sequence[int], seed: int = 0) -> None:
        self.prompt_len, self.reference = prompt_len, list(reference)
        self.rng = np.random.default_rng(seed)

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.inner.begin(prompt, params, rng)

    def observe(self, hidden: np.ndarray, positions: np.ndarray, next_tokens: list[int]) -> None:
        self.inner.observe(hidden, positions, next_tokens)

    def propose(self, history: list[int], n: int) -> Proposal:
        inner = list(self.inner.propose(history, n).tokens)  # the real cost is paid
        k = len(history) - self.prompt_len  # the reference index of the token that follows history
        out: list[int] = []
        for i in range(n):
            if k + i >= len(self.reference):
                break
            true = self.reference[k + i]
            if self.rng.random() < self.probability:
                out.append(true)
            else:
                tok = inner[i] if i < len(inner) else true
                out.append(tok if tok != true else (true - 1 if true > 0 else true + 1))
        return Proposal(out, None)


class AlwaysDraft:
    """A governor stand-in that drafts every round (the raw cost of speculation, no switching off)."""

    event_count = 0
    events: list[tuple[str, int]] = []

    def decide(self, force: bool = False) -> bool:
        return True

    def record(self, drafted: bool, n_tokens: int, seconds: float) -> None:
        pass

    def events_since(self, mark: int) -> list[tuple[str, int]]:
        return []


# ---- one loaded pair --------------------------------------------------------------------------------------------
@dataclass
class Run:
    tps: float
    tokens: list[int]
    stats: RequestDraftStats | None = None


class Bench:
    """A target (+ drafter) loaded once through LocalModel; plain and speculative greedy runs on its engine."""

    def __init__(self, model: Any, drafter: Any = None, draft_tokens: int = 3, threads: int = 0, n_ctx: int = 1024):
        from .local import LocalModel, LocalModelConfig

        self.lm = LocalModel(LocalModelConfig(model, drafter=drafter, draft_tokens=draft_tokens, context_length=n_ctx,
                                              threads=threads))
        self.path = Path(self.lm.path)
        self.arch = str(getattr(self.lm.model, "arch", self.lm.file.architecture))
        self.draft_tokens = draft_tokens
        self.threads = threads or (os.cpu_count() or 1)
        ds = self.lm.drafter_source
        self.drafter_kind = ds.kind if ds is not None else None
        self.drafter_name = None if ds is None else (
            str(ds.source.value) if ds.source is not None else ds.kind.replace("_", "-"))

    def encode(self, text: str) -> list[int]:
        return self.lm.tokenizer.encode(text)

    def _run(self, ids: list[int], max_tokens: int, spec: Speculation | None) -> Run:
        gen = Generation()
        for _ in self.lm.engine.stream(ids, max_tokens, SamplingParams(), frozenset(), gen, spec):
            pass
        return Run(gen.timings.tokens_per_second, list(gen.tokens), spec.stats if spec is not None else None)

    def plain(self, ids: list[int], max_tokens: int) -> Run:
        return self._run(ids, max_tokens, None)

    def spec(self, ids: list[int], max_tokens: int, governor: Any, draft_tokens: int | None = None,
             controlled: float | None = None, reference: Sequence[int] = (), seed: int = 0) -> Run:
        if self.lm.drafter is None:
            raise ValueError("no drafter loaded")
        drafter: Any = self.lm.drafter
        if controlled is not None:
            drafter = ControlledDrafter(drafter, controlled)
            drafter.expect(len(ids), reference, seed)
        spec = Speculation(drafter, draft_tokens or self.draft_tokens, governor, RequestDraftStats(),
                           getattr(self.lm.model, "rollback_limit", None))
        return self._run(ids, max_tokens, spec)

    def close(self) -> None:
        del self.lm
        gc.collect()


def _sum_stats(runs: Sequence[Run]) -> RequestDraftStats:
    total = RequestDraftStats()
    for r in runs:
        if r.stats is not None:
            total.rounds += r.stats.rounds
            total.drafted += r.stats.drafted
            total.accepted += r.stats.accepted
            for mine, theirs in ((total.drafted_per_position, r.stats.drafted_per_position),
                                 (total.accepted_per_position, r.stats.accepted_per_position)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, c in enumerate(theirs):
                    mine[i] += c
    return total


def _rnd(x: float | None, k: int = 3) -> float | None:
    return None if x is None or x != x else round(x, k)


def _draft_summary(runs: Sequence[Run]) -> dict[str, Any]:
    s = _sum_stats(runs)
    return {
        "acceptance_rate": _rnd(s.acceptance_rate()),
        "tokens_per_round": _rnd(s.tokens_per_round()),
        "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
        "acceptance_per_position": [_rnd(a / d if d else None) for a, d in
                                    zip(s.accepted_per_position, s.drafted_per_position, strict=True)],
    }


# ---- sections -----------------------------------------------------------------------------------------------------
Log = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def stderr_log(msg: str) -> None:
    """Progress lines go to stderr; the table or JSON goes to stdout."""
    print(msg, file=sys.stderr, flush=True)


def prompts_for(n_per_category: int) -> dict[str, list[str]]:
    return {c: PROMPTS[c][: max(1, n_per_category)] for c in CATEGORIES}


def run_categories(b: Bench, prompts: dict[str, list[str]], reps: int, max_tokens: int, governed: bool = True,
                   controlled: float | None = None, log: Log = _quiet) -> dict[str, Any]:
    """The table: per category, plain and speculative runs interleaved prompt by prompt, `reps` times. One governor
    serves every speculative request (as a LocalModel keeps it across requests)."""
    governor: Any = Governor() if governed else AlwaysDraft()
    plain: dict[str, list[float]] = {c: [] for c in prompts}
    spec: dict[str, list[Run]] = {c: [] for c in prompts}
    exact = True
    for rep in range(reps):
        for cat, texts in prompts.items():
            for i, text in enumerate(texts):
                ids = b.encode(text)
                p = b.plain(ids, max_tokens)
                s = b.spec(ids, max_tokens, governor, controlled=controlled, reference=p.tokens, seed=1000 * rep + i)
                exact = exact and p.tokens == s.tokens
                plain[cat].append(p.tps)
                spec[cat].append(s)
                log(f"  rep {rep + 1} {cat:5s} #{i}: plain {p.tps:6.2f} tok/s, spec {s.tps:6.2f} tok/s")
    out: dict[str, Any] = {}
    for cat in prompts:
        ps, ss = plain[cat], [r.tps for r in spec[cat]]
        out[cat] = {
            "plain_tps": _rnd(median(ps), 2), "spec_tps": _rnd(median(ss), 2),
            "speedup": _rnd(median(ss) / median(ps)),
            "plain_tps_range": spread(ps), "spec_tps_range": spread(ss), "n_runs": len(ps),
            **_draft_summary(spec[cat]),
        }
    events = governor.events if isinstance(governor, Governor) else []
    return {"categories": out, "exact": exact, "governed": governed, "controlled_probability": controlled,
            "governor_events": [[k, i] for k, i in events]}


def run_sweep(b: Bench, prompts: list[str], values: Sequence[int], max_tokens: int, controlled: float | None = None,
              log: Log = _quiet) -> dict[str, Any]:
    """Tokens/s versus draft_tokens (drafting every round), with plain decoding on the same prompts alongside."""
    ids = [b.encode(t) for t in prompts]
    plain, refs = [], []
    for x in ids:
        r = b.plain(x, max_tokens)
        plain.append(r.tps)
        refs.append(r.tokens)
    points = []
    for n in values:
        runs = [b.spec(x, max_tokens, AlwaysDraft(), draft_tokens=n, controlled=controlled, reference=ref, seed=j)
                for j, (x, ref) in enumerate(zip(ids, refs, strict=True))]
        tps = [r.tps for r in runs]
        points.append({"draft_tokens": n, "spec_tps": _rnd(median(tps), 2), "spec_tps_range": spread(tps),
                       "speedup": _rnd(median(tps) / median(plain)), **_draft_summary(runs)})
        log(f"  draft_tokens {n}: {median(tps):6.2f} tok/s (plain {median(plain):6.2f})")
    return {"plain_tps": _rnd(median(plain), 2), "controlled_probability": controlled, "points": points}


def run_curve(b: Bench, prompts: list[str], levels: Sequence[float], max_tokens: int, reps: int = 1,
              draft_tokens: int | None = None, log: Log = _quiet) -> dict[str, Any]:
    """Speedup versus acceptance (controlled, drafting every round): per level, plain and speculative runs
    interleaved on the same prompts."""
    ids = [b.encode(t) for t in prompts]
    points = []
    for p in levels:
        plain, runs = [], []
        for rep in range(reps):
            for j, x in enumerate(ids):
                r = b.plain(x, max_tokens)
                plain.append(r.tps)
                runs.append(b.spec(x, max_tokens, AlwaysDraft(), draft_tokens=draft_tokens, controlled=p,
                                   reference=r.tokens, seed=100 * rep + j))
        tps = [r.tps for r in runs]
        points.append({"probability": round(p, 4), "plain_tps": _rnd(median(plain), 2),
                       "spec_tps": _rnd(median(tps), 2), "speedup": _rnd(median(tps) / median(plain)),
                       **_draft_summary(runs)})
        log(f"  P={p:.3f}: acceptance {points[-1]['acceptance_rate']}, tokens/round {points[-1]['tokens_per_round']}"
            f", speedup {points[-1]['speedup']}")
    return {"draft_tokens": draft_tokens or b.draft_tokens, "points": points}


def run_poor_drafter(b: Bench, prompts: list[str], max_tokens: int, warmup: int = 4, reps: int = 3,
                     probability: float = 0.0, log: Log = _quiet) -> dict[str, Any]:
    """Issue 6 item 3: a drafter whose acceptance is poor (controlled, P near 0), governed, against plain decoding,
    side by side. The governor is kept across requests (as in a LocalModel): `warmup` governed requests first (it
    measures, switches drafting off and lengthens its probe interval), then `reps` plain / governed pairs timed."""
    ids = [b.encode(t) for t in prompts]
    governor = Governor()
    refs = [b.plain(x, max_tokens).tokens for x in ids]
    cold = []
    for w in range(warmup):
        j = w % len(ids)
        cold.append(b.spec(ids[j], max_tokens, governor, controlled=probability, reference=refs[j], seed=w).tps)
    mark = governor.event_count
    plain, gov, runs = [], [], []
    for rep in range(reps):
        for j, x in enumerate(ids):
            plain.append(b.plain(x, max_tokens).tps)
            r = b.spec(x, max_tokens, governor, controlled=probability, reference=refs[j], seed=10_000 + rep)
            gov.append(r.tps)
            runs.append(r)
            log(f"  rep {rep + 1} #{j}: plain {plain[-1]:6.2f} tok/s, governed {gov[-1]:6.2f} tok/s")
    ratio = median(gov) / median(plain)
    every = cold + gov  # the cold requests too: the governor's measuring and first probes included
    return {
        "ratio_including_warmup": _rnd(float(np.mean(every)) / median(plain)),
        "probability": probability, "warmup_requests": warmup, "warmup_governed_tps": [round(x, 2) for x in cold],
        "plain_tps": _rnd(median(plain), 2), "governed_tps": _rnd(median(gov), 2),
        "plain_tps_range": spread(plain), "governed_tps_range": spread(gov),
        "ratio": _rnd(ratio), "target": 0.98, "passed": bool(ratio >= 0.98),
        "governor_events_timed": [[k, i] for k, i in governor.events_since(mark)],
        "governor_events_all": [[k, i] for k, i in governor.events], **_draft_summary(runs),
    }


# ---- llama.cpp --------------------------------------------------------------------------------------------------
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
        history = list(prompt) + out
        drafter = PromptLookupDrafter() if draft_tokens else None
        stats = RequestDraftStats()
        t0 = time.perf_counter()
        while len(out) < n:
            k = min(draft_tokens, n - len(out) - 1)
            drafts = list(drafter.propose(history, k).tokens[:k]) if drafter is not None and k > 0 else []
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
            history += new
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
@dataclass
class BenchOptions:
    model: Any
    drafter: Any = None
    draft_tokens: int = 3
    threads: int = 0
    reps: int = 3
    max_tokens: int = 128
    prompts_per_category: int = 3
    governed: bool = True
    controlled: float | None = None  # the table's controlled acceptance probability (None: the real drafter)
    acceptance: Sequence[float] = ()  # curve levels (controlled); empty: no curve
    sweep: Sequence[int] = (1, 2, 3, 4)
    sweep_categories: Sequence[str] = CATEGORIES  # the first prompt of each feeds the sweep, curve and poor drafter
    curve_reps: int = 1
    poor_drafter: bool = False
    poor_warmup: int = 4
    poor_reps: int = 2
    llama: bool = True
    pass_sizes: Sequence[int] = (1, 2, 3, 4, 5)
    name: str = ""


def run_bench_options(o: BenchOptions, log: Log = _quiet) -> dict[str, Any]:
    t0 = time.perf_counter()
    b = Bench(o.model, o.drafter, o.draft_tokens, o.threads, n_ctx=1024)
    prompts = prompts_for(o.prompts_per_category)
    sweep_prompts = [PROMPTS[c][0] for c in o.sweep_categories]
    res: dict[str, Any] = {
        "name": o.name or b.path.name, "model": b.path.name, "arch": b.arch, "drafter": b.drafter_name,
        "draft_tokens": o.draft_tokens, "threads": b.threads, "max_tokens": o.max_tokens, "reps": o.reps,
        "prompts_per_category": o.prompts_per_category, "cpu_count": os.cpu_count(),
    }
    log(f"== {res['name']}: {b.path.name} ({b.arch}), drafter {b.drafter_name}, threads {b.threads}")
    if b.lm.drafter is not None:
        log("categories")
        res.update(run_categories(b, prompts, o.reps, o.max_tokens, o.governed, o.controlled, log))
        if o.sweep:
            log("draft_tokens sweep")
            res["sweep"] = run_sweep(b, sweep_prompts, o.sweep, o.max_tokens, o.controlled, log)
        if o.acceptance:
            log("acceptance curve")
            res["curve"] = run_curve(b, sweep_prompts, o.acceptance, o.max_tokens, o.curve_reps, log=log)
        if o.poor_drafter:
            log("poorly-accepted drafter, governed vs plain")
            res["poor_drafter"] = run_poor_drafter(b, sweep_prompts, o.max_tokens, o.poor_warmup, o.poor_reps, log=log)
    else:
        plain = {c: [b.plain(b.encode(t), o.max_tokens).tps for _ in range(o.reps) for t in ts]
                 for c, ts in prompts.items()}
        res["categories"] = {c: {"plain_tps": _rnd(median(v), 2), "plain_tps_range": spread(v)}
                             for c, v in plain.items()}
    if o.llama:
        log("llama.cpp")
        ms = sorted(set(o.pass_sizes) | {1, o.draft_tokens + 1})
        res["llama"] = run_llama(b, prompts, max(1, o.reps // 2), o.max_tokens, ms, log=log)
    _attach_llama(res)
    b.close()
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def _attach_llama(res: dict[str, Any]) -> None:
    """Copy llama.cpp's figures next to cuca's per category, and its modelled speedups at the published level and
    at each curve point."""
    llama = res.get("llama", {})
    for cat, c in llama.get("categories", {}).items():
        mine = res.get("categories", {}).get(cat)
        if mine is not None:
            mine["llama_plain_tps"] = c.get("plain_tps")
            if "spec_tps" in c:
                mine["llama_spec_tps"] = c["spec_tps"]
                mine["llama_speedup"] = c["speedup"]
    arch, n = res["arch"], res["draft_tokens"]
    level = PUBLISHED.get(arch)
    if level is not None:
        tpr = level.get("tokens_per_round", 1 + n * level.get("acceptance_rate", 0.0))
        at = llama_at_acceptance(arch, llama, tpr, n)
        if at is not None:
            res["llama_published"] = at
        anchor = anchor_at_acceptance(arch, tpr, n)
        if anchor is not None:
            res["llama_published_anchor"] = {"tokens_per_round": round(tpr, 3), "speedup": anchor,
                                              "source": "perf-anchor.md section 7 (native llama.cpp build, t=2, "
                                                        "n_draft 3): verify, draft and plain step ms"}
    for p in res.get("curve", {}).get("points", []):
        if p.get("tokens_per_round") is not None:
            at = llama_at_acceptance(arch, llama, p["tokens_per_round"], res["curve"]["draft_tokens"])
            if at is not None:
                p["llama_speedup"] = at["speedup"]
            anchor = anchor_at_acceptance(arch, p["tokens_per_round"], res["curve"]["draft_tokens"])
            if anchor is not None:
                p["llama_speedup_anchor"] = anchor


# ---- output -------------------------------------------------------------------------------------------------------
def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_report(res: dict[str, Any]) -> str:
    lines = [f"== {res['name']}: {res['model']} ({res['arch']})  drafter {res.get('drafter')}  "
             f"draft_tokens {res['draft_tokens']}  threads {res['threads']}  {res['max_tokens']} tokens x "
             f"{res['reps']} reps x {res['prompts_per_category']} prompts"]
    if res.get("controlled_probability") is not None:
        lines.append(f"controlled acceptance: P = {res['controlled_probability']:.3f} per draft")
    lines.append(f"{'category':8s} {'plain tok/s':>20s} {'spec tok/s':>20s} {'speedup':>8s} {'accept':>7s} "
                 f"{'tok/round':>9s} {'llama plain':>11s} {'llama spec':>10s} {'llama x':>8s}")
    for cat, c in res.get("categories", {}).items():
        pr, sr = c.get("plain_tps_range") or [0, 0], c.get("spec_tps_range") or [0, 0]
        pl = f"{_f(c.get('plain_tps'), '{:.1f}')} ({pr[0]:.1f}-{pr[1]:.1f})"
        sp = f"{_f(c.get('spec_tps'), '{:.1f}')} ({sr[0]:.1f}-{sr[1]:.1f})" if c.get("spec_tps") is not None else "-"
        lines.append(f"{cat:8s} {pl:>20s} {sp:>20s} {_f(c.get('speedup'), '{:.2f}x'):>8s} "
                     f"{_f(c.get('acceptance_rate'), '{:.0%}'):>7s} {_f(c.get('tokens_per_round')):>9s} "
                     f"{_f(c.get('llama_plain_tps')):>11s} {_f(c.get('llama_spec_tps')):>10s} "
                     f"{_f(c.get('llama_speedup'), '{:.2f}x'):>8s}")
    if "exact" in res:
        lines.append(f"greedy output equal to plain decoding: {res['exact']}; governed: {res.get('governed')}; "
                     f"governor decisions: {res.get('governor_events')}")
    if "sweep" in res:
        sw = res["sweep"]
        pts = "  ".join(f"n={p['draft_tokens']}: {_f(p['spec_tps'])} ({_f(p['speedup'], '{:.2f}x')})"
                        for p in sw["points"])
        lines.append(f"tokens/s vs draft_tokens (drafting every round; plain {_f(sw['plain_tps'])}): {pts}")
    if "curve" in res:
        lines.append(f"speedup vs acceptance (controlled, draft_tokens {res['curve']['draft_tokens']}, drafting every "
                     f"round):")
        lines.append(f"  {'P':>6s} {'accept':>7s} {'tok/round':>9s} {'plain':>7s} {'spec':>7s} {'cuca x':>7s} "
                     f"{'llama x (here)':>14s} {'llama x (anchor)':>16s}")
        for p in res["curve"]["points"]:
            lines.append(f"  {p['probability']:6.3f} {_f(p['acceptance_rate'], '{:.0%}'):>7s} "
                         f"{_f(p['tokens_per_round']):>9s} {_f(p['plain_tps']):>7s} {_f(p['spec_tps']):>7s} "
                         f"{_f(p['speedup'], '{:.2f}x'):>7s} {_f(p.get('llama_speedup'), '{:.2f}x'):>14s} "
                         f"{_f(p.get('llama_speedup_anchor'), '{:.2f}x'):>16s}")
    if "llama_published" in res:
        lp = res["llama_published"]
        lines.append(f"llama.cpp at the published level ({lp['tokens_per_round']} tokens/round): {lp['speedup']:.2f}x "
                     f"(verify {lp['verify_ms']:.1f} ms, plain step {lp['plain_ms']:.1f} ms, draft {lp['draft_ms']:.1f}"
                     f" ms per step from {lp['draft_cost_source']})")
    if "llama_published_anchor" in res:
        la = res["llama_published_anchor"]
        lines.append(f"llama.cpp at the published level from {la['source']}: {la['speedup']:.2f}x")
    if (res.get("llama") or {}).get("pass_suspect"):
        lines.append(f"WARNING: {res['llama']['pass_suspect']}")
    if "poor_drafter" in res:
        pd = res["poor_drafter"]
        lines.append(f"poorly-accepted drafter (P={pd['probability']}), governed vs plain side by side: "
                     f"{_f(pd['governed_tps'])} vs {_f(pd['plain_tps'])} tok/s = {_f(pd['ratio'], '{:.3f}x')} "
                     f"(target >= 0.98: {'pass' if pd['passed'] else 'FAIL'}); after {pd['warmup_requests']} warm-up "
                     f"requests at {pd['warmup_governed_tps']} tok/s (all governed requests: "
                     f"{_f(pd.get('ratio_including_warmup'), '{:.3f}x')}); decisions while timed: "
                     f"{pd['governor_events_timed']}")
    llama = res.get("llama")
    if llama and "skipped" in llama:
        lines.append(f"llama.cpp: skipped ({llama['skipped']})")
    elif llama and "pass_cost" in llama:
        pc = llama["pass_cost"]
        ms = list(pc["cuca"])
        lines.append("M-row pass (logits for every row) cost vs M=1:  " + "  ".join(f"M={m}" for m in ms))
        for who in ("cuca", "llama.cpp"):
            lines.append(f"  {who:10s} " + "  ".join(f"{pc[who][m]:4.2f}" for m in ms)
                         + f"   (M=1: {llama['pass_ms'][who]['1']:.1f} ms)")
    lines.append(f"({res.get('seconds', 0):.0f} s)")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """One PNG: per pair a row of speedup per category, tokens/s vs draft_tokens, speedup vs acceptance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 3, figsize=(15, 4 * len(results)), squeeze=False)
    for row, res in zip(axes, results, strict=True):
        ax = row[0]
        cats = [c for c in CATEGORIES if c in res.get("categories", {})]
        xs = np.arange(len(cats))
        sp = [res["categories"][c].get("speedup") or 0.0 for c in cats]
        ax.bar(xs - 0.2, sp, 0.4, label="cuca")
        ll = [res["categories"][c].get("llama_speedup") for c in cats]
        if any(v is not None for v in ll):
            ax.bar(xs + 0.2, [v or 0.0 for v in ll], 0.4, label="llama.cpp")
        lp = res.get("llama_published")
        if lp is not None:
            ax.axhline(lp["speedup"], color="C1", ls="--", label="llama.cpp at the published level (computed)")
        page = PRODUCT_PAGE.get(res["arch"])
        if page and res.get("controlled_probability") is not None:
            ax.scatter(xs - 0.2, [page[c] for c in cats], marker="_", s=400, color="k",
                       label="product page (32 cores)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(xs, cats)
        ax.set_ylabel("speedup over plain")
        ax.set_title(f"{res['name']}: speedup per category")
        ax.legend(fontsize=8)
        ax = row[1]
        if "sweep" in res:
            pts = res["sweep"]["points"]
            ax.plot([p["draft_tokens"] for p in pts], [p["spec_tps"] for p in pts], "o-", label="speculative")
            ax.axhline(res["sweep"]["plain_tps"], color="grey", ls="--", label="plain")
            ax.set_xticks([p["draft_tokens"] for p in pts])
            ax.legend(fontsize=8)
        ax.set_xlabel("draft_tokens")
        ax.set_ylabel("tokens/s")
        ax.set_title("tokens/s vs draft_tokens")
        ax = row[2]
        if "curve" in res:
            pts = [p for p in res["curve"]["points"] if p.get("acceptance_rate") is not None]
            ax.plot([p["acceptance_rate"] for p in pts], [p["speedup"] for p in pts], "o-", label="cuca (measured)")
            la = [p for p in pts if p.get("llama_speedup_anchor") is not None]
            if la:
                ax.plot([p["acceptance_rate"] for p in la], [p["llama_speedup_anchor"] for p in la], "^:",
                        color="C2", label="llama.cpp (perf-anchor native build costs)")
            lp = [p for p in pts if p.get("llama_speedup") is not None]
            if lp:
                ax.plot([p["acceptance_rate"] for p in lp], [p["llama_speedup"] for p in lp], "s--",
                        label="llama.cpp (from its verify + draft cost)")
            level = PUBLISHED.get(res["arch"])
            if level is not None:
                n = res["curve"]["draft_tokens"]
                rate = level.get("acceptance_rate", (level.get("tokens_per_round", 1.0) - 1) / n)
                ax.axvline(rate, color="r", ls=":", label=f"published ({rate:.0%} at n={n})")
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no controlled-acceptance curve\n(real drafter: see the table)", ha="center",
                    va="center", transform=ax.transAxes)
        ax.set_xlabel("acceptance rate")
        ax.set_ylabel("speedup over plain")
        ax.set_title("speedup vs acceptance (controlled)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- command line ---------------------------------------------------------------------------------------------------
def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `cuca bench` on an argparse subparsers object."""
    p = subparsers.add_parser("bench", help="speculative vs plain throughput per prompt category, and llama.cpp's",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(p)
    return p


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="a GGUF path or a preset name")
    p.add_argument("--drafter", default=None, help="prompt-lookup, in-trunk, or a drafter GGUF path / preset")
    p.add_argument("--draft-tokens", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="0: every core")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=3, help="prompts per category (1-3)")
    p.add_argument("--no-governor", action="store_true", help="draft every round in the table")
    p.add_argument("--controlled", type=float, default=None, metavar="P",
                   help="controlled acceptance in the table: each draft is the target's own token with probability P")
    p.add_argument("--acceptance", type=float, nargs="*", default=[], metavar="P",
                   help="controlled acceptance levels P for a speedup-vs-acceptance curve")
    p.add_argument("--published", action="store_true",
                   help="controlled acceptance at the published level of the target's architecture (table and curve)")
    p.add_argument("--sweep", type=int, nargs="*", default=[1, 2, 3, 4], help="draft_tokens values for the sweep")
    p.add_argument("--poor-drafter", action="store_true",
                   help="governed run with a poorly-accepted (controlled P=0) drafter against plain decoding")
    p.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    p.add_argument("--quick", action="store_true", help="1 rep, 1 prompt per category, 32 tokens, short sweep")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--png", default=None, help="write a chart here (needs matplotlib: pip install cuca[bench])")
    p.add_argument("--all", action="store_true", help="the full report (benchmarks/report.py) into --out")
    p.add_argument("--out", default="report", help="folder for --all")


def options_from_args(a: argparse.Namespace) -> BenchOptions:
    o = BenchOptions(a.model, a.drafter, a.draft_tokens, a.threads, a.reps, a.max_tokens, a.prompts,
                     not a.no_governor, a.controlled, list(a.acceptance), list(a.sweep), poor_drafter=a.poor_drafter,
                     llama=not a.no_llama)
    if a.quick:
        o.reps, o.prompts_per_category, o.max_tokens, o.poor_warmup, o.poor_reps = 1, 1, 32, 1, 1
        o.sweep = [n for n in o.sweep if n in (1, 3)] or list(o.sweep)[:1]
    return o


def run_bench(a: argparse.Namespace) -> int:
    """Run `cuca bench` from parsed arguments; returns the exit status."""
    if a.all:
        report = Path(__file__).resolve().parent.parent / "benchmarks" / "report.py"
        if not report.is_file():
            print("cuca bench --all: needs a source checkout (benchmarks/report.py and the synthetic-file writers)",
                  file=sys.stderr)
            return 2
        import runpy

        sys.argv = [str(report), "--out", a.out] + (["--quick"] if a.quick else []) + (
            ["--threads", str(a.threads)] if a.threads else [])
        runpy.run_path(str(report), run_name="__main__")
        return 0
    if not a.model:
        print("cuca bench: a MODEL is needed (or --all)", file=sys.stderr)
        return 2
    o = options_from_args(a)
    if a.published:
        from .gguf import open_gguf
        from .sources import ModelSource

        arch = open_gguf(ModelSource.parse(a.model).resolve()).architecture
        p = published_probability(arch, o.draft_tokens)
        if p is None:
            print(f"cuca bench: no published acceptance level for architecture {arch!r}", file=sys.stderr)
            return 2
        o.controlled = p
        o.acceptance = sorted(set(o.acceptance) | {0.0, round(p, 4), 1.0})
    log: Log = stderr_log
    from .errors import CucaError

    try:
        res = run_bench_options(o, log)
    except CucaError as e:
        print(f"cuca: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res))
    else:
        print(format_report(res))
    if a.png:
        plot([res], a.png)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cuca bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    return run_bench(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
