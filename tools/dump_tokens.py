"""Dump the tokens cuca generates for every fixture case and every target/drafter pair, as JSON: run it before and
after a refactor that must not change outputs, and compare the two files (`cmp`).

    python tools/dump_tokens.py OUT.json [--no-real]

Covered: the real PyPI models' fixture prompts (tests/fixtures/generation_*.json: plain greedy, greedy with prompt
lookup, seeded sampling with prompt lookup), the synthetic llama / gemma3 (prompt lookup), gemma4 + its assistant
and qwen35 + its in-trunk head (the pair tests' prompts, draft_tokens 1..16), greedy and seeded sampling. Drafting
runs every round (AlwaysDraft), so nothing depends on timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tools")]

import synth_qwen35  # noqa: E402
from synth import write_tiny  # noqa: E402
from synth_gemma4 import write_gemma4, write_gemma4_assistant  # noqa: E402
from test_spec_pairs import PROMPTS  # noqa: E402

from cuca import DrafterSource, LocalModel, LocalModelConfig  # noqa: E402
from cuca.speculative.governor import AlwaysDraft  # noqa: E402

PAIR_PROMPTS = [PROMPTS[i] for i in (0, 1, 2, 3, 4, 6)]  # the pair tests' prompts
SAMPLED = dict(temperature=0.8, top_k=20, seed=5)


def _load(path: Path, drafter: Any = None, k: int = 3, n_ctx: int = 128) -> LocalModel:
    lm = LocalModel.load_sync(LocalModelConfig(path, drafter=drafter, draft_tokens=k, threads=2, context_length=n_ctx))
    lm.governor = AlwaysDraft()  # type: ignore[assignment]
    return lm


def _runs(lm: LocalModel, prompts: list[list[int]], n: int, sampled: bool = True) -> list[list[int]]:
    out = [lm.complete_sync(p, max_tokens=n).tokens for p in prompts]
    if sampled:
        out += [lm.complete_sync(p, max_tokens=n, **SAMPLED).tokens for p in prompts]  # type: ignore[arg-type]
    return out


def synthetic(d: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for arch in ("llama", "gemma3"):
        path = write_tiny(d / f"{arch}.gguf", arch=arch)
        res[f"tiny-{arch}/plain"] = _runs(_load(path), PAIR_PROMPTS, 40)
        for k in (1, 3, 8):
            res[f"tiny-{arch}/lookup/k{k}"] = _runs(_load(path, DrafterSource.prompt_lookup(), k), PAIR_PROMPTS, 40)
    g4 = write_gemma4(d / "g4.gguf")
    ga = write_gemma4_assistant(d / "g4a.gguf")
    q = synth_qwen35.write(d / "q.gguf")
    res["gemma4/plain"] = _runs(_load(g4), PAIR_PROMPTS, 20)
    res["qwen35/plain"] = _runs(_load(q), PAIR_PROMPTS, 20)
    for k in (1, 2, 3, 4, 8, 16):
        res[f"gemma4/assistant/k{k}"] = _runs(_load(g4, DrafterSource.file(ga), k), PAIR_PROMPTS, 20)
        res[f"qwen35/in_trunk/k{k}"] = _runs(_load(q, DrafterSource.IN_TRUNK, k), PAIR_PROMPTS, 20)
    res["qwen35/in_trunk/k20"] = _runs(_load(q, DrafterSource.IN_TRUNK, 20), PAIR_PROMPTS, 40)
    return res


def real() -> dict[str, Any]:
    from conftest import PRESETS

    res: dict[str, Any] = {}
    for name, preset in PRESETS.items():
        cases = json.loads((ROOT / "tests" / "fixtures" / f"generation_{name}.json").read_text())["cases"]
        prompts = [c["prompt_ids"] for c in cases]
        n = max(len(c["greedy"]) for c in cases)
        res[f"{name}/plain"] = _runs(_load(preset, n_ctx=512), prompts, n, sampled=False)
        res[f"{name}/lookup"] = _runs(_load(preset, DrafterSource.prompt_lookup(), 3, 512), prompts, n)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--no-real", action="store_true", help="skip the real PyPI models")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = synthetic(Path(d))
    if not a.no_real:
        res.update(real())
    Path(a.out).write_text(json.dumps(res, indent=0, sort_keys=True))
    print(f"{a.out}: {len(res)} runs, {sum(len(v) for v in res.values())} sequences")


if __name__ == "__main__":
    main()
