"""The full benchmark report (issue 8, and issue 6 item 3) in one command:

    python benchmarks/report.py [--out report/] [--threads 2] [--folder /work/bench] [--quick] [--only NAME ...]
                                [--reps N] [--max-tokens N] [--kernel-ms M ...]

For each pair in PAIRS (the synthetic real-shape Gemma 4 E2B target + assistant, the synthetic Qwen 3.5 0.8B with
its in-trunk MTP head when cuca.models.qwen35 exists, the real Gemma 3 270M and SmolLM2-135M with prompt lookup): the
category table (plain and governed speculative runs interleaved; synthetic pairs at the published acceptance level by
controlled acceptance), tokens/s vs draft_tokens, the speedup-vs-acceptance curve (synthetic pairs), a
poorly-accepted drafter under the governor against plain decoding (synthetic pairs), and llama.cpp's figures on the
same file from llama.cpp's native build (benchmarks/peer/build_llamacpp.sh), measured in the same run. Then the
M-row pass cost vs M = 1..17 per weight format, cuca vs llama.cpp. Sized to finish in under 30
minutes on the 2-core project machine when it is otherwise idle.

Writes OUT/report.json (everything), OUT/report.md (the tables and the summary), OUT/report.png (per pair: speedup
per category, tokens/s vs draft_tokens, speedup vs acceptance) and OUT/kernels.png (pass cost vs M per format).
Synthetic files are written once into --folder (about 4.3 GB) and reused.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))  # this checkout's cuca, not an installed one

from cuca import bench as B  # noqa: E402
from cuca.bench.report import peer_build  # noqa: E402
from cuca.kernels import ISA  # noqa: E402

KERNEL_FORMATS = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


class Skip(Exception):
    """A pair that cannot run here; the message goes into the report."""


@dataclass
class Pair:
    """How to bench one target + drafter: `make(folder)` returns (target, drafter source) or raises Skip;
    `synthetic` pairs run at the published acceptance by controlled acceptance, with the curve and the poor drafter."""

    make: Callable[[Path], tuple[Any, Any]]
    arch: str
    synthetic: bool
    note: str = ""
    options: dict[str, Any] = field(default_factory=dict)


def _gemma4_e2b(folder: Path) -> tuple[Any, Any]:
    from synth_gemma4 import e2b_files

    tgt, dft = e2b_files(folder)
    return tgt, str(dft)


def _qwen35_08b(folder: Path) -> tuple[Any, Any]:
    if importlib.util.find_spec("cuca.models.qwen35") is None:
        raise Skip("cuca.models.qwen35 is not in this checkout yet (branch qwen35)")
    writer = ROOT / "tools" / "synth_qwen35.py"
    if not writer.is_file():
        raise Skip("tools/synth_qwen35.py (the real-shape writer) is not in this checkout")
    path = folder / "qwen35-0.8b-synth-q8_0.gguf"
    if not path.exists():
        sys.path.insert(0, str(writer.parent))
        import synth_qwen35 as S

        tmp = path.with_suffix(".tmp")
        S.write(tmp, S.REAL_0_8B, qtype=S.Q.Q8_0, seed=0)
        tmp.rename(path)
    return path, "in-trunk"


def _preset(name: str) -> tuple[Any, Any]:
    from cuca.errors import CucaError
    from cuca.sources import ModelSource

    try:
        ModelSource.parse(name).resolve()
    except CucaError as e:
        raise Skip(f"the {name} preset is not installed ({e})") from e
    return name, "prompt-lookup"


def _gemma3_270m(folder: Path) -> tuple[Any, Any]:
    return _preset("gemma3-270m-q4_k_m")


def _smollm2_135m(folder: Path) -> tuple[Any, Any]:
    return _preset("smollm2-135m-instruct-q4_1")


# name -> pair; a new pair (e.g. a real Qwen 3.5 file) plugs in here by name.
PAIRS: dict[str, Pair] = {
    "gemma4-e2b": Pair(_gemma4_e2b, "gemma4", True, "synthetic weights, real shapes: Q4_0 target (Q6_K embeddings) "
                       "+ gemma4-assistant drafter (F16 file)"),
    "qwen35-0.8b": Pair(_qwen35_08b, "qwen35", True, "synthetic weights, real shapes: Q8_0 target with its in-trunk "
                        "MTP head"),
    "gemma3-270m": Pair(_gemma3_270m, "gemma3", False, "the real Gemma 3 270M (Q4_K_M) with prompt lookup",
                        {"prompts_per_category": 3, "reps": 4}),
    # 24 pairs per category: a 96-token SmolLM2 request takes ~0.6 s and its plain rate moved 105-210 tok/s within
    # one section on the 2-core Zen 3 VM (12 pairs' medians moved by +-0.03 run to run)
    "smollm2-135m": Pair(_smollm2_135m, "llama", False, "the real SmolLM2-135M-Instruct (Q4_1, the default model "
                         "the install brings) with prompt lookup", {"prompts_per_category": 2, "reps": 12}),
}


def options_for(name: str, pair: Pair, target: Any, drafter: Any, threads: int, quick: bool) -> B.BenchOptions:
    o = B.BenchOptions(target, drafter, draft_tokens=3, threads=threads, reps=3, max_tokens=128,
                       prompts_per_category=1, sweep=(1, 2, 3, 4), name=name, pass_sizes=(1, 2, 3, 4, 5))
    if pair.synthetic:
        p = B.published_probability(pair.arch, 3)
        assert p is not None
        # synthetic weights: the category only changes the prompt, so one prompt per category; the sweep, the
        # curve and the poor drafter use the list prompt (24 pairs: one request's tok/s moves by +-10% here; 8
        # pairs' median ratio gave 0.948x with the governor's probes taking 4 rounds of 760, and 16 pairs read
        # Qwen 3.5 at 0.963-0.982x in four runs on a Zen 3 VM whose fixed costs come to under 1%); the curve's
        # point at the published level (the summary's "drafting every round") 5 pairs, the other levels 1
        o = replace(o, controlled=p, acceptance=sorted({0.0, 0.25, 0.5, round(p, 4), 0.9, 1.0}),
                    sweep_categories=("list",), poor_drafter=True, poor_warmup=4, poor_reps=24,
                    controlled_curve_reps=5)
    o = replace(o, **pair.options)
    if quick:
        o = replace(o, reps=1, prompts_per_category=1, max_tokens=32, sweep=(1, 3), poor_warmup=1, poor_reps=1,
                    acceptance=[a for a in o.acceptance if a in (0.0, 1.0) or abs(a - (o.controlled or -1)) < 1e-3],
                    sweep_categories=("list",), controlled_curve_reps=0)
    return o


def summary(results: dict[str, Any]) -> list[str]:
    """The closing figures: per synthetic pair, cuca's measured speedup at the published acceptance beside
    llama.cpp's modelled one (both from this run)."""
    out = ["## Summary", ""]
    for name, res in results.items():
        if "skipped" in res or "error" in res:
            out.append(f"- **{name}**: {res.get('skipped') or res.get('error')}")
            continue
        arch = res["arch"]
        cats = res.get("categories", {})
        if res.get("controlled_probability") is not None:
            level = B.PUBLISHED[arch]
            p = res["controlled_probability"]
            curve = [pt for pt in res.get("curve", {}).get("points", []) if abs(pt["probability"] - p) < 1e-3]
            raw = curve[0]["speedup"] if curve else None
            gov = {c: v.get("speedup") for c, v in cats.items()}
            lp = res.get("llama_published", {})
            line = (f"- **{name}** at the published level ({level}, P = {p:.3f} per draft; measured acceptance "
                    f"{_pct(curve[0]['acceptance_rate']) if curve else '-'}, "
                    f"{curve[0]['tokens_per_round'] if curve else '-'} tokens/round): cuca drafting every round "
                    f"**{_x(raw)}** (measured, medians of {curve[0].get('pairs', '-') if curve else '-'} plain / "
                    "speculative pairs), governed per category "
                    f"{', '.join(f'{c} {_x(v)}' for c, v in gov.items())}"
                    f"; llama.cpp ({peer_build(res.get('llama', {}))} build) **{_x(lp.get('speedup'))}** "
                    "(modelled from its round and plain-step "
                    "costs measured in this run)")
            own = [v.get("llama_speedup") for v in cats.values() if v.get("llama_speedup") is not None]
            if own:
                line += f"; llama.cpp's own speculation measured at its own acceptance {_x(min(own))}-{_x(max(own))}"
            ref = lp.get("speedup")
            if raw is not None and ref is not None:  # both from this run
                line += (f" -> same-run verdict: cuca {'beats' if raw > ref else 'does NOT beat'} llama.cpp "
                         f"({_x(raw)} measured vs {_x(ref)} modelled)")
            out.append(line + ".")
        else:
            parts = [f"{c} {_x(v.get('speedup'))} (acceptance {_pct(v.get('acceptance_rate'))}"
                     f"{', llama.cpp ' + _x(v['llama_speedup']) if v.get('llama_speedup') is not None else ''})"
                     for c, v in cats.items()]
            out.append(f"- **{name}** ({res.get('drafter')}): " + "; ".join(parts) + ".")
        lp_plain = res.get("llama", {}).get("plain", {})
        if lp_plain.get("cuca_over_llama_plain") is not None:
            bw = res.get("bandwidth", {})
            share = {w: bw.get(w, {}).get("of_read_bandwidth") for w in ("cuca", "llama.cpp")}
            pair = {w: bw.get(w, {}).get("of_read_bandwidth_paired") for w in ("cuca", "llama.cpp")}
            out.append(f"  - plain decode: cuca {lp_plain.get('cuca_plain_tps_same_time')} tok/s vs llama.cpp "
                       f"{lp_plain.get('plain_tps')} tok/s = **{_x(lp_plain['cuca_over_llama_plain'])}** (same run)"
                       + (f"; achieved bandwidth {_pct(share['cuca'])} of the read bandwidth (llama.cpp "
                          f"{_pct(share['llama.cpp'])})" if share["cuca"] is not None else "")
                       + (f", {_pct(pair['cuca'])} (llama.cpp {_pct(pair['llama.cpp'])}) paired with a read sample "
                          "before each run" if pair["cuca"] is not None else "") + ".")
        if "poor_drafter" in res:
            pd = res["poor_drafter"]
            out.append(f"  - poorly-accepted drafter (P = {pd['probability']}), governed vs plain side by side "
                       f"(median of {pd.get('pairs', 'the')} pairs' ratios): {_x(pd['ratio'], 3)} "
                       f"({'pass' if pd['passed'] else 'FAIL'}, target >= 0.98) after "
                       f"{pd['warmup_requests']} warm-up requests of the kept governor; counting those requests too: "
                       f"{_x(pd.get('ratio_including_warmup'), 3)}.")
    return out


def _x(v: Any, k: int = 2) -> str:
    return "-" if v is None else f"{v:.{k}f}x"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.0%}"


def kernel_table(kern: dict[str, Any]) -> list[str]:
    first = next(iter(next(iter(kern.values())).values()), {}) if kern else {}
    ms = list(first.get("cost", {})) or ["1"]
    lines = ["## M-row pass cost relative to M = 1 per weight format (cuca: logits for every row; llama.cpp: "
             "llama-bench pp M of the build the pairs name, last row's logits)", "",
             "| format | engine | M=1 ms | " + " | ".join(f"M={m}" for m in ms[1:]) + " |",
             "|---|---|---|" + "---|" * (len(ms) - 1)]
    for fmt, per in kern.items():
        for who, t in per.items():
            lines.append(f"| {fmt} | {who} | {t['ms']['1']:.1f} | " + " | ".join(f"{t['cost'][m]:.2f}"
                                                                              for m in ms[1:]) + " |")
    return lines


def plot_kernels(kern: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    for i, (fmt, per) in enumerate(kern.items()):
        color = f"C{i % 10}"
        for who, style in (("cuca", "-"), ("llama.cpp", "--")):
            if who in per:
                c = per[who]["cost"]
                ax.plot([int(m) for m in c], list(c.values()), style, color=color, label=f"{fmt} {who}")
    ax.set_xlabel("rows M in the pass")
    ax.set_ylabel("time relative to M = 1")
    ax.set_title("M-row pass cost per weight format: cuca (solid) vs llama.cpp (dashed)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("report"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--folder", type=Path, default=Path("/work/bench") if Path("/work/bench").is_dir()
                    else Path("/tmp/cuca-bench"), help="where the synthetic files are written once")
    ap.add_argument("--quick", action="store_true", help="tiny settings, to check the machinery")
    ap.add_argument("--only", nargs="*", default=None, help=f"pairs to run (of {', '.join(PAIRS)}; 'kernels')")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per figure (default: each pair's own, 3; "
                    "the small real models keep their larger count)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per reply (default 128)")
    ap.add_argument("--kernel-ms", type=int, nargs="*", default=None, help="the M values of the pass-cost sweep "
                    "(default 1..17)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    md = ["# cuca benchmark report", "",
          f"threads {a.threads}; ISA {ISA} (cuca.kernels.ISA: the C kernels' build); "
          f"{'QUICK settings (machinery check, not figures)' if a.quick else 'full settings'}"
          f"{f'; reps {a.reps}' if a.reps else ''}{f'; {a.max_tokens} tokens per reply' if a.max_tokens else ''}; "
          f"started {time.strftime('%Y-%m-%d %H:%M:%S')}", ""]
    log = B.stderr_log
    for name, pair in PAIRS.items():
        if a.only is not None and name not in a.only:
            continue
        try:
            target, drafter = pair.make(a.folder)
            o = options_for(name, pair, target, drafter, a.threads, a.quick)
            o = replace(o, llama=not a.no_llama)
            if a.reps is not None:  # the poor-drafter check keeps its own poor_reps pairs
                # the small real models keep their larger count: a request there is a few hundred ms and its tok/s
                # moves by +-5-10% (SmolLM2 prose, drafting off: 16 pairs' ratios 0.91-1.11x, median 1.004x)
                o = replace(o, reps=max(a.reps, pair.options.get("reps", 0) if not a.quick else 0))
            if a.max_tokens is not None:
                o = replace(o, max_tokens=a.max_tokens)
            res = B.run_bench_options(o, log)
            res["note"] = pair.note
        except Skip as e:
            res = {"name": name, "skipped": str(e)}
        except Exception as e:  # one pair failing must not lose the others
            res = {"name": name, "error": f"{type(e).__name__}: {e}"}
        results[name] = res
        text = B.format_report(res) if "categories" in res else f"== {name}: {res.get('skipped') or res['error']}"
        print(text, flush=True)
        md += [f"## {name}", "", pair.note, "", "```", text, "```", ""]
        (a.out / "report.json").write_text(json.dumps({"pairs": results}, indent=1))
    kern: dict[str, Any] = {}
    if a.only is None or "kernels" in a.only:
        from bench_kernels import pass_costs

        fmts = ["Q4_0", "Q8_0"] if a.quick else KERNEL_FORMATS
        plan = (1, [1, 2, 4, 17]) if a.quick else (a.reps or 3, a.kernel_ms)
        kern = pass_costs(a.folder / "kernels", fmts, a.threads, plan,
                          llama=not a.no_llama, log=log)
        md += kernel_table(kern) + [""]
    md = md[:4] + summary(results) + [""] + md[4:]
    total = time.perf_counter() - t0
    md.append(f"Total time: {total / 60:.1f} min.")
    (a.out / "report.json").write_text(json.dumps({"isa": ISA, "pairs": results, "kernels": kern,
                                                   "seconds": round(total)}, indent=1))
    (a.out / "report.md").write_text("\n".join(md) + "\n")
    try:
        done = [r for r in results.values() if "categories" in r]
        if done:
            B.plot(done, a.out / "report.png")
        if kern:
            plot_kernels(kern, a.out / "kernels.png")
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install 'cuca[bench]')", file=sys.stderr)
    print("\n".join(summary(results)))
    print(f"report in {a.out}/ ({total / 60:.1f} min)")


if __name__ == "__main__":
    main()
