"""The GPU device check of issue 19, in one run of a few minutes:

    python benchmarks/gpu_check.py [--device cuda] [--folder /tmp/cuca-gpu] [--max-tokens 64] [--reps 2]
    python benchmarks/gpu_check.py --smoke      # torch-cpu, tiny files, static passes: the script's own test

It writes the real-shape synthetic files (tests/synth_gemma4.py e2b_files: Gemma 4 E2B Q4_0 + its assistant F16;
tools/synth_qwen35.py: Qwen 3.5 0.8B Q8_0 without its MTP head, and a 4-layer qwen35 draft model with the same
vocabulary: the in-trunk head runs on the CPU only, so on a GPU Qwen 3.5 drafts with a draft-model file), then per
pair reports:
  - load seconds, plain decode tokens/s;
  - speculative tokens/s, governed and drafting every round, at the published acceptance (controlled acceptance,
    cuca.bench ACCEPTANCE_SHAPE: Gemma 4 48 % of drafts, Qwen 3.5 2.7 tokens per round, draft_tokens 3), interleaved
    with plain runs, and the speedups;
  - the governor with a drafter that is never right (P = 0) against plain decoding;
  - the verify-pass cost for M = 1..8 relative to M = 1 (forward + arg-max, medians);
  - whether greedy speculative output equals plain output on the device (reported, not asserted: on a GPU the
    batched kernels round a row differently with M), with the real drafter and with the controlled one;
  - peak GPU memory.
Targets on an H200 (reported as met / not met, never asserted): Gemma 4 E2B plain >= 200 tokens/s; speculative at the
published acceptance >= 1.3x plain; the governor >= 0.98x plain with a drafter that is never right.
Figures go to stdout as text and to --json (default FOLDER/gpu_check.json).

On the project's lent H200 (its image has torch, numpy, tokenizers, jinja2, huggingface_hub, tqdm, pyyaml and
requests, not gguf; the C extension is not needed: the torch backend does not call it): here, in the checkout,
`echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
--implementation cp --platform manylinux2014_x86_64 -d .whl gguf==0.19.0`, then one run carrying ".whl" with
`python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PYTHONUNBUFFERED=1 && python3 benchmarks/gpu_check.py --folder /tmp/g --json $OUT/gpu_check.json 2>&1 | tee
$OUT/log` (timeout about 540 s; `--only gemma4` or `--only qwen35` halves a rerun).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))  # this checkout's cuca

from cuca import bench as B  # noqa: E402

TARGETS = {"gemma4_plain_tps": 200.0, "spec_speedup": 1.3, "poor_ratio": 0.98}


def gemma4_files(folder: Path, smoke: bool) -> tuple[Path, Path]:
    import synth_gemma4 as G

    if not smoke:
        return G.e2b_files(folder)
    t, a = folder / "gemma4-tiny.gguf", folder / "gemma4-tiny-assistant.gguf"
    if not t.exists():
        G.write_gemma4(t)
        G.write_gemma4_assistant(a)
    return t, a


def qwen35_files(folder: Path, smoke: bool) -> tuple[Path, Path]:
    import synth_qwen35 as S

    t = folder / ("qwen35-tiny.gguf" if smoke else "qwen35-0.8b-synth-nomtp-q8_0.gguf")
    d = folder / ("qwen35-tiny-draft.gguf" if smoke else "qwen35-draft-4l-synth-q8_0.gguf")
    shape = S.TINY if smoke else S.REAL_0_8B
    draft = S.TINY if smoke else replace(S.REAL_0_8B, n_embd=256, n_layer=4, n_head=4, n_head_kv=1, head_dim=64,
                                         n_ff=768, n_rot=32, d_state=64, k_heads=4, v_heads=4)
    for path, s, seed in ((t, shape, 0), (d, draft, 1)):
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            S.write(tmp, s, qtype=S.Q.Q8_0, seed=seed, mtp=False)
            tmp.rename(path)
    return t, d


def pass_cost(b: B.Bench, sizes: range, reps: int, n_prompt: int = 64) -> dict[str, Any]:
    """Median ms of one M-row pass (forward + arg-max, as a greedy verify pass) after an n_prompt-token prompt, the
    sizes taking turns; the first round is a warm-up (graph captures)."""
    model, eng = b.lm.model, b.lm.engine
    cache = eng.cache
    tok = min(B.PASS_TOKEN, int(model.n_vocab) - 1)
    cache.reset()
    eng.prefill([tok] * n_prompt)
    hybrid = hasattr(cache, "restore")
    ms: dict[int, list[float]] = {m: [] for m in sizes}
    for r in range(reps + 1):
        for m in sizes:
            snap = cache.snapshot() if hybrid else None
            toks, pos = np.full(m, tok, np.int32), np.arange(cache.n, cache.n + m, dtype=np.int32)
            t0 = time.perf_counter()
            model.argmax(model.forward_hidden(toks, pos, cache))  # the ids come back: synchronised
            dt = (time.perf_counter() - t0) * 1e3
            cache.restore(snap) if hybrid else cache.trim(m)
            if r:
                ms[m].append(dt)
    cache.reset()
    med = {m: statistics.median(v) for m, v in ms.items()}
    return {"ms": {m: round(v, 3) for m, v in med.items()},
            "relative": {m: round(v / med[1], 3) for m, v in med.items()}}


def gpu_memory(device: str, reset: bool = False) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return None
    return int(torch.cuda.max_memory_allocated(device))


def check_pair(arch: str, files: tuple[Path, Path], a: argparse.Namespace) -> dict[str, Any]:
    log = B.stderr_log
    gpu_memory(a.device, reset=True)
    t0 = time.perf_counter()
    b = B.Bench(str(files[0]), str(files[1]), draft_tokens=3, n_ctx=a.n_ctx, device=a.device)
    ops = b.lm.model.ops
    ops.pass_rows = max(ops.pass_rows, 9)  # the M = 1..8 sweep captures its passes too
    if a.passes:
        ops.passes = a.passes
    out: dict[str, Any] = {"arch": arch, "target": files[0].name, "drafter": files[1].name,
                           "drafter_kind": b.drafter_kind, "load_s": round(time.perf_counter() - t0, 1),
                           "passes": ops.passes, "weights": str(ops.wdtype)}
    log(f"== {arch}: {files[0].name} + {files[1].name} on {a.device} ({ops.passes} passes), loaded in "
        f"{out['load_s']} s")
    prompts = B.prompts_for(1)
    texts = [t for ts in prompts.values() for t in ts]
    work = B.Workload(a.max_tokens, a.reps)
    p = B.published_probability(arch)
    out["published_probability"] = p
    log("  every round, the real drafter (greedy identity)")
    real = B.run_categories(b, prompts, B.Workload(a.max_tokens, 1), governed=False, controlled=None, log=log)
    log("  governed, published acceptance")
    gov = B.run_categories(b, prompts, work, governed=True, controlled=p, log=log)
    log("  every round, published acceptance")
    every = B.run_categories(b, prompts, work, governed=False, controlled=p, log=log)
    log("  a drafter that is never right, governed")
    poor = B.run_poor_drafter(b, texts, work, warmup=1 if a.smoke else 4, probability=0.0, log=log)
    log("  verify-pass cost")
    out["pass_cost"] = pass_cost(b, range(1, 9), 1 if a.smoke else max(3, a.reps), 16 if a.smoke else 64)
    plain = statistics.median(c["plain_tps"] for r in (gov, every) for c in r["categories"].values())
    out.update({
        "plain_tps": round(plain, 2),
        "governed": _summary(gov), "every_round": _summary(every), "real_drafter": _summary(real),
        "poor_drafter": {k: poor[k] for k in ("plain_tps", "governed_tps", "ratio", "ratio_including_warmup")},
        "greedy_identity": {"real_drafter": real["exact"], "controlled_governed": gov["exact"],
                            "controlled_every_round": every["exact"]},
        "peak_gpu_bytes": gpu_memory(a.device),
        "graph_errors": list(ops.graph_errors),  # captures that failed: those passes ran eagerly
    })
    b.close()
    gc.collect()
    return out


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    cats = r["categories"]
    return {"spec_tps": round(statistics.median(c["spec_tps"] for c in cats.values()), 2),
            "speedup": round(statistics.median(c["speedup"] for c in cats.values()), 3),
            "acceptance_rate": [c["acceptance_rate"] for c in cats.values()],
            "tokens_per_round": [c["tokens_per_round"] for c in cats.values()],
            "per_category": {k: {"plain_tps": c["plain_tps"], "spec_tps": c["spec_tps"], "speedup": c["speedup"]}
                             for k, c in cats.items()}}


def verdicts(res: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, met or not (reported, never asserted)."""
    lines = []
    for r in res:
        x, s, q = r["plain_tps"], r["governed"]["speedup"], r["poor_drafter"]["ratio"]
        t = TARGETS
        if r["arch"] == "gemma4":
            lines.append(f"gemma4 plain decode {x} tok/s >= {t['gemma4_plain_tps']}: {x >= t['gemma4_plain_tps']}")
        lines.append(f"{r['arch']} governed speculative {s}x >= {t['spec_speedup']}x: {s >= t['spec_speedup']}")
        lines.append(f"{r['arch']} governor, drafter never right, {q}x >= {t['poor_ratio']}x: "
                     f"{q is not None and q >= t['poor_ratio']}")
    return lines


def table(res: list[dict[str, Any]]) -> str:
    rows = []
    for r in res:
        g, e, pc = r["governed"], r["every_round"], r["pass_cost"]["relative"]
        rows += [f"{r['arch']}: {r['target']} + {r['drafter']} ({r['drafter_kind']}), load {r['load_s']} s, "
                 f"{r['passes']} passes, weights {r['weights']}",
                 f"  plain {r['plain_tps']} tok/s | governed {g['spec_tps']} ({g['speedup']}x, acceptance "
                 f"{g['acceptance_rate']}) | every round {e['spec_tps']} ({e['speedup']}x)",
                 f"  drafter never right, governed: {r['poor_drafter']['ratio']}x plain",
                 "  verify pass / M=1: " + "  ".join(f"M={m}: {v}" for m, v in pc.items())
                 + f"  (M=1: {r['pass_cost']['ms'][1]} ms)",
                 f"  greedy speculative == plain: {r['greedy_identity']}",
                 f"  peak GPU memory: {r['peak_gpu_bytes'] and round(r['peak_gpu_bytes'] / 2**30, 2)} GiB",
                 f"  failed graph captures: {r['graph_errors'] or 'none'}"]
    return "\n".join(rows + verdicts(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--folder", default="/tmp/cuca-gpu-check")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--passes", choices=["graph", "static", "eager"], default=None,
                    help="how passes run (default: graph on CUDA, eager on CPU tensors)")
    ap.add_argument("--only", choices=["gemma4", "qwen35"], default=None)
    ap.add_argument("--smoke", action="store_true", help="torch-cpu, tiny files, static passes, short runs")
    ap.add_argument("--json", default=None, help="where to write the figures (default FOLDER/gpu_check.json)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.device, a.max_tokens, a.reps, a.n_ctx = "torch-cpu", 8, 1, 256
        a.passes = a.passes or "static"
    folder = Path(a.folder)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = []
    for arch, files in (("gemma4", gemma4_files), ("qwen35", qwen35_files)):
        if a.only in (None, arch):
            tw = time.perf_counter()
            paths = files(folder, a.smoke)
            B.stderr_log(f"files for {arch} ready in {time.perf_counter() - tw:.1f} s")
            res.append(check_pair(arch, paths, a))
    doc = {"device": a.device, "smoke": a.smoke, "max_tokens": a.max_tokens, "reps": a.reps, "results": res,
           "targets": TARGETS, "verdicts": verdicts(res), "seconds": round(time.perf_counter() - t0, 1)}
    if a.device.startswith("cuda"):
        import torch

        doc["gpu"] = torch.cuda.get_device_name(a.device)
    out = Path(a.json) if a.json else folder / "gpu_check.json"
    out.write_text(json.dumps(doc, indent=1))
    print(table(res))
    print(f"({doc['seconds']} s; figures in {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
