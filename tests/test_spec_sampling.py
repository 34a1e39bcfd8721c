"""Speculative *sampling* through LocalModel emits what plain sampling of the same model emits, for each drafter kind
(prompt lookup, the gemma4 assistant, the in-trunk MTP head, a draft model), on tiny synthetic (and, for the draft
model, converted) files.

Each request generates 4 tokens at temperature > 0 with a seed (seeded requests draft every round): the first comes
from the prefill, the next from a speculative round of 2 drafts (accepted drafts, a correction from the residual,
the bonus token). The statistic is the pair (t2, t3) of the requests whose first token is the likeliest
one; its exact law under plain sampling is computed from the target's own forward passes through the same
`to_probs` (so plain sampling is compared exactly, not through a second noisy sample), and a chi-square goodness of
fit must not reject it. With the real drafter kinds its power is limited (the tiny drafters are rarely right, or
nearly one-hot where they are); the last test adds a drafter whose q overlaps p (the target at twice its
temperature: 75% of drafts accepted) and shows the fit rejects those drafts verified against a wrong q (p ~ 1e-141).
(Dropping q altogether is not a defect the fit could catch: verification that treats drafts as deterministic is
exact for drafts drawn from any distribution, only less often accepted.)
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import chi2_sf
from synth_gemma4 import write_gemma4, write_gemma4_assistant

from cuca import DrafterSource, LocalModel, LocalModelConfig
from cuca.engine import Engine
from cuca.sampling import SamplingParams, to_probs
from cuca.speculative.decoder import SpeculativeDecoder
from cuca.speculative.governor import AlwaysDraft
from cuca.speculative.proposal import Proposal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35 as S  # noqa: E402

N = 400  # requests per drafter kind
TOP = 4  # t2 values whose t3 is resolved; the rest of t2 is one cell
P_MIN = 1e-3
GEMMA4_PROMPT = [2, 17, 319, 143, 496, 61, 293, 160, 281, 368, 494, 130, 499, 350, 425, 256, 318, 496]
QWEN_PROMPT = [2, 40, 41, 42, 43, 40, 41, 42]
DENSE_PROMPT = [200, 36, 245, 77, 199, 121, 26, 290]  # its first token has p 0.62 at temperature 0.5


def _copy_head(path: Path) -> Path:
    """The tiny qwen35 with an MTP head that repeats its input token: its q is peaked where the target's repetitive
    output often goes, so drafts are accepted often but not always (q differs from p)."""
    s, t = S.TINY, S.weights(S.TINY, 0)
    p = f"blk.{s.n_layer}."
    t[p + "nextn.eh_proj.weight"] = np.concatenate([np.eye(s.n_embd), np.zeros((s.n_embd, s.n_embd))], 1)
    t[p + "attn_output.weight"] = np.zeros_like(t[p + "attn_output.weight"])
    t[p + "ffn_down.weight"] = np.zeros_like(t[p + "ffn_down.weight"])
    return S.write(path, s, edits=S.Edits(tensors=t))


KINDS: dict[str, tuple[float, list[int]]] = {  # temperature, prompt
    "prompt_lookup": (1.0, GEMMA4_PROMPT),
    "assistant": (1.0, GEMMA4_PROMPT),
    "in_trunk": (5.0, QWEN_PROMPT),
    "draft_model": (0.5, DENSE_PROMPT),  # the converted qwen3 drafted by its family's tiny random drafter
}
CONVERTED = Path(__file__).parent / "fixtures" / "converted"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sampling")
    return {"gemma4": write_gemma4(d / "g4.gguf"), "assistant": write_gemma4_assistant(d / "a.gguf"),
            "qwen35": _copy_head(d / "q.gguf")}


def _model(files: dict[str, Path], kind: str) -> LocalModel:
    target = {"in_trunk": files["qwen35"], "draft_model": CONVERTED / "qwen3-f32.gguf"}.get(kind, files["gemma4"])
    drafter = {"prompt_lookup": DrafterSource.prompt_lookup(), "assistant": DrafterSource.file(files["assistant"]),
               "in_trunk": DrafterSource.IN_TRUNK,
               "draft_model": DrafterSource.file(CONVERTED / "qwen3-draft-f32.gguf")}[kind]
    lm = LocalModel.load_sync(LocalModelConfig(target, drafter=drafter, draft_tokens=2, threads=1, context_length=64))
    if kind == "in_trunk":
        lm.drafter.n_rank = S.DRAFT_VOCAB_TINY  # type: ignore[union-attr]  # q over a padded draft vocabulary
    return lm


def exact_law(model: Any, prompt: list[int], params: SamplingParams) -> tuple[int, dict[Any, float]]:
    """The likeliest first token and the plain-sampling law of (t2, t3) after it: cells (a, b) for the TOP likeliest
    t2 values a, and "rest" for every other t2."""
    eng = Engine(model, 64)

    def probs(ids: list[int]) -> np.ndarray:
        eng.cache.reset()
        return to_probs(eng.prefill(ids), params)

    t1 = int(np.argmax(probs(prompt)))
    p2 = probs([*prompt, t1])
    top = [int(a) for a in np.argsort(-p2)[:TOP]]
    law: dict[Any, float] = {"rest": float(1.0 - p2[top].sum())}
    for a in top:
        p3 = probs([*prompt, t1, a])
        law.update({(a, int(b)): float(p2[a] * p3[b]) for b in np.nonzero(p3)[0]})
    return t1, law


def fit(counts: Counter, law: dict[Any, float]) -> float:
    """Chi-square goodness of fit; cells expecting fewer than 5 are pooled per t2 value (and then all together)."""
    n = sum(counts.values())
    assert all(k in law for k in counts), f"a pair plain sampling never emits: {set(counts) - set(law)}"
    obs: list[float] = []
    exp: list[float] = []
    pool_o = pool_e = 0.0
    for a in sorted({k[0] for k in law if k != "rest"}) + ["rest"]:
        keys = ["rest"] if a == "rest" else [k for k in law if k != "rest" and k[0] == a]
        small = [k for k in keys if law[k] * n < 5]
        obs += [counts[k] for k in keys if k not in small]
        exp += [law[k] * n for k in keys if k not in small]
        so, se = sum(counts[k] for k in small), sum(law[k] for k in small) * n
        if se >= 5:
            obs.append(so)
            exp.append(se)
        else:
            pool_o, pool_e = pool_o + so, pool_e + se
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    o, e = np.array(obs, np.float64), np.array(exp, np.float64)
    return chi2_sf(float(((o - e) ** 2 / e).sum()), len(o) - 1)


def run(lm: LocalModel, prompt: list[int], temperature: float, t1: int, law_top: set[int]) -> tuple[Counter, int, int]:
    """(counts of (t2, t3) after t1 -- "rest" for a t2 outside `law_top` --, drafted, accepted) over N seeds."""
    counts: Counter = Counter()
    drafted = accepted = 0
    for seed in range(N):
        r = lm.complete_sync(prompt, max_tokens=4, temperature=temperature, seed=seed)
        assert r.draft is not None
        drafted, accepted = drafted + r.draft.drafted, accepted + r.draft.accepted
        if r.tokens[0] == t1:
            counts[(r.tokens[1], r.tokens[2]) if r.tokens[1] in law_top else "rest"] += 1
    return counts, drafted, accepted


def _check(files: dict[str, Path], kind: str) -> tuple[float, int, int, int]:
    temperature, prompt = KINDS[kind]
    lm = _model(files, kind)
    t1, law = exact_law(lm.model, prompt, SamplingParams(temperature))
    counts, drafted, accepted = run(lm, prompt, temperature, t1, {k[0] for k in law if k != "rest"})
    p = fit(counts, law)
    print(f"\n{kind}: {sum(counts.values())} of {N} requests after t1={t1}, "
          f"drafted {drafted}, accepted {accepted}, chi-square p = {p:.3g}")
    return p, sum(counts.values()), drafted, accepted


@pytest.mark.parametrize("kind", list(KINDS))
def test_speculative_sampling_matches_plain_sampling(files: dict[str, Path], kind: str) -> None:
    p, n, drafted, accepted = _check(files, kind)
    assert n >= 80, "too few requests kept: the law's first token is not likely enough"
    assert drafted >= N // 4 and 0 < accepted < drafted  # drafts were proposed, some accepted, some rejected
    assert p > P_MIN


class TemperedSelf:
    """A drafter with power: the target itself at a higher temperature, so q overlaps p everywhere but is not p.
    `q_temperature` is the temperature of the q it reports (a mismatch is the defect the fit must catch). It
    re-reads the committed text on every proposal (tiny model, short texts) instead of keeping a cache."""

    def __init__(self, model: Any, temperature: float, q_temperature: float):
        self.engine, self.temperature, self.q_temperature = Engine(model, 64), temperature, q_temperature

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.text, self.rng = [prompt[0]], rng

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray) -> None:
        self.text += tokens

    def propose(self, n: int) -> Proposal:
        self.engine.cache.reset()
        logits, drafts, qs = self.engine.prefill(self.text), [], []
        for i in range(n):
            q = to_probs(logits, SamplingParams(self.temperature))
            drafts.append(int(self.rng.choice(len(q), p=q)))
            qs.append(q if self.q_temperature == self.temperature else to_probs(logits, SamplingParams(
                self.q_temperature)))
            if i + 1 < n:
                logits = self.engine.prefill([drafts[-1]])
        return Proposal(drafts, np.stack(qs))


def _tempered_run(files: dict[str, Path], q_temperature: float) -> tuple[float, int, int, int]:
    temperature, prompt = TEMPERED
    model = LocalModel.load_sync(LocalModelConfig(files["gemma4"], threads=1, context_length=64)).model
    t1, law = exact_law(model, prompt, SamplingParams(temperature))
    top, counts, drafted, accepted = {k[0] for k in law if k != "rest"}, Counter(), 0, 0
    for seed in range(N):
        drafter = TemperedSelf(model, 2.0 * temperature, q_temperature * temperature)
        dec = SpeculativeDecoder(model, model.make_cache(64), drafter, AlwaysDraft(), 2)
        toks = list(dec.generate(prompt, 4, SamplingParams(temperature, seed=seed), np.random.default_rng(seed)))
        drafted, accepted = drafted + dec.stats.drafted, accepted + dec.stats.accepted
        if toks[0] == t1:
            counts[(toks[1], toks[2]) if toks[1] in top else "rest"] += 1
    return fit(counts, law), sum(counts.values()), drafted, accepted


TEMPERED = (0.5, GEMMA4_PROMPT)  # the target's temperature (peaked p) and prompt; the drafter samples at twice it


def test_a_drafter_whose_q_overlaps_p_keeps_the_law_and_a_wrong_q_is_caught(files: dict[str, Path]) -> None:
    """The power the drafters above lack: drafts sampled from a broad q that overlaps p, accepted often. The exact
    loop passes the fit; the same drafts verified against the wrong q (the target's own temperature instead of the
    one they were drawn at) must fail it."""
    p, n, drafted, accepted = _tempered_run(files, q_temperature=2.0)
    print(f"\ntempered self: {n} of {N} kept, drafted {drafted}, accepted {accepted}, p = {p:.3g}")
    assert n >= 80 and 0 < accepted < drafted
    assert p > P_MIN
    p_wrong, _, _, _ = _tempered_run(files, q_temperature=1.0)
    print(f"wrong q: p = {p_wrong:.3g}")
    assert p_wrong < P_MIN, f"the fit cannot tell drafts verified against the wrong q (p = {p_wrong:.3g})"
