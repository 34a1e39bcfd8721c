"""`cuca bench`: is speculative decoding faster, and than what?

For a target (+ drafter), greedy 128-token replies to prompts in three categories (code, list, prose), plain and
speculative runs interleaved in one process, several repetitions. Reported: tokens/s medians with their spread,
the speedup per category, acceptance rate and mean tokens per round, the governor's decisions, and llama.cpp's
figures on the same file from its native build (peer.py), measured in the same run.

Controlled acceptance (for files whose weights are synthetic, where a real drafter is never right): see
ACCEPTANCE_SHAPE.

Sections (each optional): categories (the table), a sweep of tokens/s over draft_tokens, a speedup-vs-acceptance
curve (controlled), a poorly-accepted drafter run with the governor against plain decoding (issue 6 item 3), and
llama.cpp (native build): plain decode, the cost of an M-row pass, its own speculation on the same pair, and its
speedup at a given acceptance modelled from its round and plain-step costs measured in the same run.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import Generation
from ..sampling import SamplingParams
from ..speculative.decoder import SpeculativeDecoder
from ..speculative.drafters import Drafter
from ..speculative.governor import AlwaysDraft, Governor, SpeedGovernor
from ..speculative.proposal import Proposal
from ..speculative.stats import RequestDraftStats

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
PASS_TOKEN = 1000  # the token fed M times in a timed M-row pass


# What controlled acceptance simulates, stated in the report beside its figures.
ACCEPTANCE_SHAPE = (
    "controlled acceptance: the drafter's real computation runs and proposes k <= draft_tokens tokens (never padded "
    "to draft_tokens); each of the k is then replaced, independently, by the target's own next token (from a plain "
    "greedy run of the same prompt) with probability P, else by a token certain to be wrong. A round stops at its "
    "first wrong draft, so draft i (1-based) is accepted with probability P^i: a geometric per-position shape, "
    "expected acceptance rate (P + P^2 + ... + P^k) / k when the drafter proposes k")


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
    """Wraps a drafter: its real computation runs, then each token it proposed (no more: a lookup drafter that
    found nothing proposes nothing) is replaced by the target's own next token with probability `probability`, else
    by the drafter's token when that is wrong, else by a wrong one (ACCEPTANCE_SHAPE). Call
    `expect(prompt_len, reference, seed)` before each request with the target's greedy continuation."""

    def __init__(self, inner: Drafter, probability: float, seed: int = 0):
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {probability}")
        self.inner, self.probability = inner, probability
        self.rng = np.random.default_rng(seed)
        self.prompt_len = 0
        self.reference: list[int] = []
        self.k = 0  # the reference index of the token after the last committed one

    def expect(self, prompt_len: int, reference: Sequence[int], seed: int = 0) -> None:
        self.prompt_len, self.reference = prompt_len, list(reference)
        self.rng = np.random.default_rng(seed)

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.inner.begin(prompt, params, rng)

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray) -> None:
        self.inner.commit(tokens, positions, hidden)
        self.k = int(positions[-1]) + 2 - self.prompt_len  # the history is now positions[-1] + 2 tokens long

    def propose(self, n: int) -> Proposal:
        inner = list(self.inner.propose(n).tokens)  # the real cost is paid
        k = self.k
        out: list[int] = []
        for i, tok in enumerate(inner[:n]):  # as many drafts as the inner drafter proposed this round
            if k + i >= len(self.reference):
                break
            true = self.reference[k + i]
            if self.rng.random() < self.probability:
                out.append(true)
            else:
                out.append(tok if tok != true else (true - 1 if true > 0 else true + 1))
        return Proposal(out, None)


@dataclass(frozen=True)
class Controlled:
    """Controlled acceptance for one speculative request: each draft is the target's own next token (from
    `reference`, its plain greedy continuation) with `probability` (None: the real drafter), drawn with `seed`."""

    probability: float | None = None
    reference: Sequence[int] = ()
    seed: int = 0


@dataclass(frozen=True)
class Workload:
    """What each section runs: greedy replies of `max_tokens` tokens, each prompt `reps` times."""

    max_tokens: int
    reps: int = 1


# ---- one loaded pair --------------------------------------------------------------------------------------------
@dataclass
class Run:
    tps: float
    tokens: list[int]
    stats: RequestDraftStats | None = None


class Bench:
    """A target (+ drafter) loaded once through LocalModel; plain and speculative greedy runs on its engine."""

    def __init__(self, model: Any, drafter: Any = None, draft_tokens: int = 3, threads: int = 0, n_ctx: int = 1024,
                 device: str = "cpu"):
        from ..local import LocalModel, LocalModelConfig
        from ..speculative.drafters.draft_model import DraftModelDrafter

        self.lm = LocalModel(LocalModelConfig(model, drafter=drafter, draft_tokens=draft_tokens, context_length=n_ctx,
                                              threads=threads, allow_long_context=True,  # tiny test files: 512
                                              device=device))
        self.path = Path(self.lm.path)
        self.arch = str(getattr(self.lm.model, "arch", self.lm.file.architecture))
        self.draft_tokens = draft_tokens
        self.threads = threads or (os.cpu_count() or 1)
        ds = self.lm.drafter_source
        self.drafter_kind = ds.kind if ds is not None else None
        if self.drafter_kind == "file" and isinstance(self.lm.drafter, DraftModelDrafter):
            self.drafter_kind = "draft_model"  # an ordinary model file: llama.cpp's draft-simple, not draft-mtp
        self.drafter_name = None if ds is None else (
            str(ds.source.value) if ds.source is not None else ds.kind.replace("_", "-"))

    def encode(self, text: str) -> list[int]:
        return self.lm.tokenizer.encode(text)

    def _run(self, ids: list[int], max_tokens: int, spec: SpeculativeDecoder | None) -> Run:
        gen = Generation()
        for _ in self.lm.engine.stream(ids, max_tokens, SamplingParams(), frozenset(), gen, spec):
            pass
        return Run(gen.timings.tokens_per_second, list(gen.tokens), spec.stats if spec is not None else None)

    def plain(self, ids: list[int], max_tokens: int) -> Run:
        return self._run(ids, max_tokens, None)

    def spec(self, ids: list[int], max_tokens: int, governor: Governor, draft_tokens: int | None = None,
             control: Controlled | None = None) -> Run:
        if self.lm.drafter is None:
            raise ValueError("no drafter loaded")
        drafter: Drafter = self.lm.drafter
        if control is not None and control.probability is not None:
            controlled_drafter = ControlledDrafter(drafter, control.probability)
            controlled_drafter.expect(len(ids), control.reference, control.seed)
            drafter = controlled_drafter
        spec = SpeculativeDecoder(self.lm.model, self.lm.engine.cache, drafter, governor,
                                  draft_tokens or self.draft_tokens)
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
                                 (total.accepted_per_position, r.stats.accepted_per_position),
                                 (total.rounds_per_depth, r.stats.rounds_per_depth)):
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
        "rounds_per_depth": s.rounds_per_depth,  # index k: rounds given k drafts (0: plain steps)
    }


def _governor_summary(governor: Governor) -> dict[str, Any]:
    """The governor's model at the end (per round length: cost, expected tokens, modelled tok/s), if it has one."""
    return {"governor": governor.summary()} if isinstance(governor, SpeedGovernor) else {}


# ---- sections -----------------------------------------------------------------------------------------------------
Log = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def stderr_log(msg: str) -> None:
    """Progress lines go to stderr; the table or JSON goes to stdout."""
    print(msg, file=sys.stderr, flush=True)


def prompts_for(n_per_category: int) -> dict[str, list[str]]:
    return {c: PROMPTS[c][: max(1, n_per_category)] for c in CATEGORIES}


def run_categories(b: Bench, prompts: dict[str, list[str]], work: Workload, governed: bool = True,
                   controlled: float | None = None, log: Log = _quiet, warmup: int = 1) -> dict[str, Any]:
    """The table: per category, plain and speculative runs interleaved prompt by prompt, `work.reps` times. One
    governor serves every speculative request (as a LocalModel keeps it across requests). First, `warmup` untimed
    plain and speculative requests on the longest prompt (drafting every round, a governor of their own: the table's
    starts cold) touch the memory the runs use: the first touch of fresh memory is not a per-request cost (on the
    2-core VM this was measured on, ~2.5 ms per MB: Qwen 3.5's first speculative request 45 tok/s, later ones 55;
    AVX-512, 2 threads, cuca vs cuca)."""
    reps, max_tokens = work.reps, work.max_tokens
    texts_all = [t for ts in prompts.values() for t in ts]
    if warmup > 0 and texts_all:
        ids = max((b.encode(t) for t in texts_all), key=len)
        for _ in range(warmup):
            w_plain = b.plain(ids, max_tokens)
            w_spec = b.spec(ids, max_tokens, AlwaysDraft())
            log(f"  warm-up (untimed): plain {w_plain.tps:6.2f} tok/s, spec {w_spec.tps:6.2f} tok/s")
    governor: Governor = SpeedGovernor() if governed else AlwaysDraft()
    plain: dict[str, list[float]] = {c: [] for c in prompts}
    spec: dict[str, list[Run]] = {c: [] for c in prompts}
    paired: dict[str, list[float]] = {c: [] for c in prompts}  # each request's spec / plain rate, run back to back
    exact = True
    for rep in range(reps):
        for cat, texts in prompts.items():
            for i, text in enumerate(texts):
                ids = b.encode(text)
                p = b.plain(ids, max_tokens)
                s = b.spec(ids, max_tokens, governor, control=Controlled(controlled, p.tokens, 1000 * rep + i))
                exact = exact and p.tokens == s.tokens
                plain[cat].append(p.tps)
                spec[cat].append(s)
                paired[cat].append(s.tps / p.tps if p.tps > 0 else 0.0)
                log(f"  rep {rep + 1} {cat:5s} #{i}: plain {p.tps:6.2f} tok/s, spec {s.tps:6.2f} tok/s")
    out: dict[str, Any] = {}
    for cat in prompts:
        ps, ss = plain[cat], [r.tps for r in spec[cat]]
        out[cat] = {
            "plain_tps": _rnd(median(ps), 2), "spec_tps": _rnd(median(ss), 2),
            "speedup": _rnd(median(ss) / median(ps)),
            # the median of the per-request ratios: a plain run and its speculative twin share the machine's state
            "speedup_paired": _rnd(median(paired[cat])),
            "plain_tps_range": spread(ps), "spec_tps_range": spread(ss), "n_runs": len(ps),
            **_draft_summary(spec[cat]),
        }
    events = governor.events if isinstance(governor, SpeedGovernor) else []
    return {"categories": out, "exact": exact, "governed": governed, "controlled_probability": controlled,
            "warmup_requests": warmup, "governor_events": [list(e) for e in events], **_governor_summary(governor)}


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
        runs = [b.spec(x, max_tokens, AlwaysDraft(), draft_tokens=n, control=Controlled(controlled, ref, j))
                for j, (x, ref) in enumerate(zip(ids, refs, strict=True))]
        tps = [r.tps for r in runs]
        points.append({"draft_tokens": n, "spec_tps": _rnd(median(tps), 2), "spec_tps_range": spread(tps),
                       "speedup": _rnd(median(tps) / median(plain)), **_draft_summary(runs)})
        log(f"  draft_tokens {n}: {median(tps):6.2f} tok/s (plain {median(plain):6.2f})")
    return {"plain_tps": _rnd(median(plain), 2), "controlled_probability": controlled, "points": points}


def run_curve(b: Bench, prompts: list[str], levels: Sequence[float], work: Workload, draft_tokens: int | None = None,
              log: Log = _quiet, reps_at: Mapping[float, int] | None = None) -> dict[str, Any]:
    """Speedup versus acceptance (controlled, drafting every round): per level, plain and speculative runs
    interleaved on the same prompts, `work.reps` times (`reps_at`: more at some levels, e.g. the published one,
    whose point is a headline figure: one pair's plain run in a fast moment of the machine moved it by 25%)."""
    max_tokens = work.max_tokens
    ids = [b.encode(t) for t in prompts]
    points = []
    for p in levels:
        reps = max([work.reps] + [n for q, n in (reps_at or {}).items() if abs(q - p) < 1e-3])  # levels: 4 places
        plain, runs = [], []
        for rep in range(reps):
            for j, x in enumerate(ids):
                r = b.plain(x, max_tokens)
                plain.append(r.tps)
                runs.append(b.spec(x, max_tokens, AlwaysDraft(), draft_tokens=draft_tokens,
                                   control=Controlled(p, r.tokens, 100 * rep + j)))
        tps = [r.tps for r in runs]
        points.append({"probability": round(p, 4), "pairs": len(plain), "plain_tps": _rnd(median(plain), 2),
                       "spec_tps": _rnd(median(tps), 2), "speedup": _rnd(median(tps) / median(plain)),
                       **_draft_summary(runs)})
        log(f"  P={p:.3f}: acceptance {points[-1]['acceptance_rate']}, tokens/round {points[-1]['tokens_per_round']}"
            f", speedup {points[-1]['speedup']}")
    return {"draft_tokens": draft_tokens or b.draft_tokens, "points": points}


def run_poor_drafter(b: Bench, prompts: list[str], work: Workload, warmup: int = 4, probability: float = 0.0,
                     log: Log = _quiet) -> dict[str, Any]:
    """Issue 6 item 3: a drafter whose acceptance is poor (controlled, P near 0), governed, against plain decoding,
    side by side. The governor is kept across requests (as in a LocalModel): `warmup` governed requests first (it
    measures, switches drafting off and lengthens its probe interval), then `work.reps` plain / governed pairs
    timed, in alternating order."""
    reps, max_tokens = work.reps, work.max_tokens
    ids = [b.encode(t) for t in prompts]
    governor = SpeedGovernor()
    refs = [b.plain(x, max_tokens).tokens for x in ids]
    cold = []
    for w in range(warmup):
        j = w % len(ids)
        cold.append(b.spec(ids[j], max_tokens, governor, control=Controlled(probability, refs[j], w)).tps)
    mark = governor.event_count
    plain, gov, runs = [], [], []
    for rep in range(reps):
        for j, x in enumerate(ids):
            first_plain = (rep + j) % 2 == 0  # the order alternates: a drift in load hits both alike
            if first_plain:
                plain.append(b.plain(x, max_tokens).tps)
            r = b.spec(x, max_tokens, governor, control=Controlled(probability, refs[j], 10_000 + rep))
            gov.append(r.tps)
            runs.append(r)
            if not first_plain:
                plain.append(b.plain(x, max_tokens).tps)
            log(f"  rep {rep + 1} #{j}: plain {plain[-1]:6.2f} tok/s, governed {gov[-1]:6.2f} tok/s")
    # each pair ran back to back: the median of the pairs' ratios cancels the load drifting between pairs
    ratio = median([g / q for g, q in zip(gov, plain, strict=True)])
    every = cold + gov  # the cold requests too: the governor's measuring and first probes included
    return {
        "ratio_including_warmup": _rnd(float(np.mean(every)) / median(plain)),
        "probability": probability, "warmup_requests": warmup, "warmup_governed_tps": [round(x, 2) for x in cold],
        "plain_tps": _rnd(median(plain), 2), "governed_tps": _rnd(median(gov), 2),
        "plain_tps_range": spread(plain), "governed_tps_range": spread(gov), "pairs": len(gov),
        "ratio": _rnd(ratio), "ratio_of_medians": _rnd(median(gov) / median(plain)),
        "ratio_source": "median over the back-to-back plain / governed pairs of governed tok/s over plain tok/s",
        "target": 0.98, "passed": bool(ratio >= 0.98),
        "governor_events_timed": [list(e) for e in governor.events_since(mark)],
        "governor_events_all": [list(e) for e in governor.events], **_draft_summary(runs),
        **_governor_summary(governor),
    }


# ---- llama.cpp --------------------------------------------------------------------------------------------------
