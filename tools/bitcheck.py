"""Fingerprints of model outputs, to show a refactor changes nothing bit for bit: greedy tokens and sha256 of the
logits of every architecture (synthetic files in the real layouts, both kernel backends, two thread counts), the
drafters' outputs (gemma4-assistant, the qwen35 MTP head), the greedy tokens of every real-model fixture case, and
the spec-pair prompts decoded plainly and with their drafter.

    python tools/bitcheck.py OUT.json            # record
    python tools/bitcheck.py NEW.json --against OUT.json   # record again and compare (exit 1 on a difference)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools")]

import synth_qwen35  # noqa: E402
from synth import Q, write_tiny  # noqa: E402
from synth_gemma4 import TargetOpts, write_gemma4, write_gemma4_assistant  # noqa: E402

from cuca.engine import Engine  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.kernels import implementations  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.gemma4_assistant import load_assistant  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402
from cuca.sampling import SamplingParams  # noqa: E402

# the spec-pair prompts' kinds: repeats, runs, one token, a long descending run, alternations
PROMPTS = [[2, *p] for p in ([10, 11, 12, 13, 14, 10, 11, 12], list(range(20, 26)), [0, 1, 2] * 2 + [0],
                              [7, 9] * 5 + [7], [300], list(range(299, 282, -1)), [120, 1] * 2 + [120],
                              list(range(70, 131, 10)))]


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:24]


def model_case(model: Any) -> dict[str, Any]:
    """Logits of a batched prompt and of chunked decoding, and greedy tokens of every prompt."""
    toks = np.array(PROMPTS[5], np.int32)
    pos = np.arange(len(toks), dtype=np.int32)
    cache = model.make_cache(96)
    out: dict[str, Any] = {"all": sha(model.forward(toks, pos, cache, "all"))}
    h = model.forward_hidden(np.array([5], np.int32), np.array([len(toks)], np.int32), cache)
    out["step_hidden"] = sha(h)
    out["step_logits"] = sha(model.head(h))
    eng = Engine(model, 96)
    out["greedy"] = [list(eng.stream(p, 20, SamplingParams())) for p in PROMPTS]
    return out


def spec_tokens(model: Any, make: Any) -> list[list[int]] | str:
    """Greedy tokens with the drafter, k=4 (the API of the day; 'n/a' when it changed)."""
    try:
        from cuca.speculative import AlwaysDraft, SpeculativeDecoder
    except ImportError:
        return "n/a"
    res = []
    for p in PROMPTS:
        eng = Engine(model, 96)
        s = SpeculativeDecoder(eng.model, eng.cache, make(eng), AlwaysDraft(), 4)
        res.append(list(eng.stream(p, 20, SamplingParams(), frozenset(), None, s)))
    return res


def synthetic(d: Path) -> dict[str, Any]:
    from cuca.speculative.drafters.assistant import AssistantDrafter
    from cuca.speculative.drafters.mtp import MTPDrafter

    impls = implementations()
    out: dict[str, Any] = {}
    files = {f"{a}-{q}": write_tiny(d / f"{a}{q}.gguf", arch=a, qtype=q) for a in ("llama", "gemma3")
             for q in (Q.Q8_0, Q.Q4_1, Q.F16)}
    files["gemma4"] = write_gemma4(d / "g4.gguf")
    files["gemma4-q4"] = write_gemma4(d / "g4q.gguf", qtype=Q.Q4_0, opts=TargetOpts(random_blocks=True))
    files["qwen35"] = synth_qwen35.write(d / "q.gguf")
    for name, path in files.items():
        for impl, threads in (("c", 2), ("c", 1), ("numpy", 2)):
            if impl in impls and (impl == "c" or name in ("llama-8", "gemma3-8", "gemma4", "qwen35")):
                out[f"{name}/{impl}/{threads}"] = model_case(load_model(open_gguf(path), Ops(threads, impls[impl])))
    g4 = load_model(open_gguf(files["gemma4"]), Ops(2))
    asst = load_assistant(open_gguf(write_gemma4_assistant(d / "a.gguf")), g4.ops, g4)
    cache = g4.make_cache(96)
    toks = np.array(PROMPTS[5], np.int32)
    h = g4.forward_hidden(toks, np.arange(len(toks), dtype=np.int32), cache)
    lg, hn = asst.step(np.array([3, 4], np.int32), np.ascontiguousarray(h[-2:]), len(toks), cache)
    out["gemma4-assistant/step"] = [sha(lg), sha(hn)]
    out["gemma4-assistant/spec"] = spec_tokens(g4, lambda eng: AssistantDrafter(asst, eng.cache))
    q = load_model(open_gguf(files["qwen35"]), Ops(2))
    mc = q.make_mtp_cache(96)
    hq = q.forward_hidden(toks, np.arange(len(toks), dtype=np.int32), q.make_cache(96))
    hm = q.mtp_forward(toks, hq, np.arange(len(toks), dtype=np.int32), mc)
    out["qwen35-mtp/step"] = [sha(hm), sha(q.mtp_logits(hm, 200))]
    out["qwen35-mtp/spec"] = spec_tokens(
        q, lambda eng: MTPDrafter(q, eng.cache.n_ctx, draft_vocab=synth_qwen35.DRAFT_VOCAB_TINY))
    return out


def real() -> dict[str, Any]:
    from conftest import real_model_path

    out: dict[str, Any] = {}
    for name in ("smollm2", "gemma3"):
        data = json.loads((ROOT / "tests" / "fixtures" / f"generation_{name}.json").read_text())
        eng = Engine(load_model(open_gguf(real_model_path(name)), Ops(2)), 512)
        for i, c in enumerate(data["cases"]):
            eng.cache.reset()
            out[f"{name}/{i}/prefill"] = sha(eng.prefill(c["prompt_ids"]))
            out[f"{name}/{i}/greedy"] = list(eng.stream(c["prompt_ids"], len(c["greedy"]), SamplingParams()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--against", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = {**synthetic(Path(d)), **real()}
    a.out.write_text(json.dumps(res, indent=1))
    print(f"{len(res)} entries -> {a.out}")
    if a.against is None:
        return 0
    old = json.loads(a.against.read_text())
    diff = [k for k in sorted(set(old) | set(res)) if old.get(k) != res.get(k)]
    for k in diff:
        print(f"DIFFERS: {k}")
    print("identical" if not diff else f"{len(diff)} of {len(old)} entries differ")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
