"""The report of `cuca bench`: options, the run of every section, the table, JSON and PNG outputs, and the
command line."""


from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..kernels import ISA as KERNEL_ISA
from .bandwidth import achieved, read_bandwidth, weight_bytes_per_token
from .core import (
    ACCEPTANCE_SHAPE,
    CATEGORIES,
    PROMPTS,
    PUBLISHED,
    Bench,
    Log,
    Workload,
    _quiet,
    _rnd,
    median,
    prompts_for,
    published_probability,
    run_categories,
    run_curve,
    run_poor_drafter,
    run_sweep,
    spread,
    stderr_log,
)
from .llama import llama_at_acceptance, run_llama


def _load() -> list[float] | None:
    """The 1/5/15-minute load averages at the start (other processes on the cores make figures noisy)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


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
    controlled_curve_reps: int = 0  # pairs at the curve's point for `controlled` (the headline figure), if more
    poor_drafter: bool = False
    poor_warmup: int = 4
    poor_reps: int = 2
    llama: bool = True
    pass_sizes: Sequence[int] = (1, 2, 3, 4, 5)
    name: str = ""
    bandwidth: bool = True  # the machine's read bandwidth and each engine's achieved GB/s, in the same run
    device: str = "cpu"  # LocalModelConfig.device: "cuda", "cuda:N", "torch-cpu" run the PyTorch backend


def run_bench_options(o: BenchOptions, log: Log = _quiet) -> dict[str, Any]:
    t0 = time.perf_counter()
    b = Bench(o.model, o.drafter, o.draft_tokens, o.threads, n_ctx=1024, device=o.device)
    prompts = prompts_for(o.prompts_per_category)
    sweep_prompts = [PROMPTS[c][0] for c in o.sweep_categories]
    res: dict[str, Any] = {
        "name": o.name or b.path.name, "model": b.path.name, "arch": b.arch, "drafter": b.drafter_name,
        "draft_tokens": o.draft_tokens, "threads": b.threads, "max_tokens": o.max_tokens, "reps": o.reps,
        "prompts_per_category": o.prompts_per_category, "cpu_count": os.cpu_count(), "isa": KERNEL_ISA,
        "load_average": _load(), "device": o.device,
    }
    log(f"== {res['name']}: {b.path.name} ({b.arch}), drafter {b.drafter_name}, threads {b.threads}")
    # the read bandwidth swings with the machine's other tenants: sampled at the start, middle and end of the run
    reads = [read_bandwidth(b.threads)] if o.bandwidth else []
    if b.lm.drafter is not None:
        log("categories")
        res.update(run_categories(b, prompts, Workload(o.max_tokens, o.reps), o.governed, o.controlled, log))
        if o.controlled is not None or o.acceptance:
            res["acceptance_shape"] = ACCEPTANCE_SHAPE
        if o.sweep:
            log("draft_tokens sweep")
            res["sweep"] = run_sweep(b, sweep_prompts, o.sweep, o.max_tokens, o.controlled, log)
        if o.acceptance:
            log("acceptance curve")
            more = {o.controlled: o.controlled_curve_reps} if o.controlled is not None else None
            res["curve"] = run_curve(b, sweep_prompts, o.acceptance, Workload(o.max_tokens, o.curve_reps), log=log,
                                     reps_at=more)
        if o.poor_drafter:
            log("poorly-accepted drafter, governed vs plain")
            res["poor_drafter"] = run_poor_drafter(b, sweep_prompts, Workload(o.max_tokens, o.poor_reps), o.poor_warmup,
                                                   log=log)
    else:
        plain = {c: [b.plain(b.encode(t), o.max_tokens).tps for _ in range(o.reps) for t in ts]
                 for c, ts in prompts.items()}
        res["categories"] = {c: {"plain_tps": _rnd(median(v), 2), "plain_tps_range": spread(v)}
                             for c, v in plain.items()}
    if o.bandwidth:
        reads.append(read_bandwidth(b.threads))
    if o.llama:
        log("llama.cpp")
        ms = sorted(set(o.pass_sizes) | {1, o.draft_tokens + 1})
        probe = (lambda: read_bandwidth(b.threads)) if o.bandwidth else None
        res["llama"] = run_llama(b, prompts, Workload(o.max_tokens, max(1, o.reps // 2)), ms, probe, log)
    _attach_llama(res)
    if o.bandwidth:
        reads.append(read_bandwidth(b.threads))
        res["bandwidth"] = _bandwidth(res, b.path, reads)
    b.close()
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["load_average_end"] = _load()
    return res


def _bandwidth(res: dict[str, Any], path: Path, reads: list[dict[str, Any]]) -> dict[str, Any]:
    """The read bandwidth samples of this run (their median is the ceiling), weight bytes per token, and each
    engine's achieved GB/s from its plain decode medians."""
    samples = [r["gbs"] for r in reads if "gbs" in r]
    bw = dict(reads[-1])
    if samples:
        bw.update(gbs=_rnd(median(samples), 2), samples=samples,
                  source=f"{bw.get('source', '')}; median of {len(samples)} samples (start, middle, end of the run)")
    per_tok = weight_bytes_per_token(path)
    cats = res.get("categories", {}).values()
    cuca_tps = median([c["plain_tps"] for c in cats if c.get("plain_tps")])
    llama_tps = res.get("llama", {}).get("plain", {}).get("plain_tps") or float("nan")
    gbs = bw.get("gbs")
    out: dict[str, Any] = {"read": bw, "weight_bytes_per_token": per_tok,
                           "cuca": {"plain_tps": _rnd(cuca_tps, 2), **achieved(per_tok, cuca_tps, gbs)},
                           "llama.cpp": {"plain_tps": _rnd(llama_tps, 2), **achieved(per_tok, llama_tps, gbs)},
                           "source": "achieved GB/s = weight bytes per token (every matrix but the lookup tables, "
                                     "the tied embedding once as the LM head) x median plain tok/s of this run"}
    # the same from read samples taken right before each pair of plain runs (the llama.cpp section): the median of
    # the per-sample shares follows a read rate that moves within the run
    pairs = res.get("llama", {}).get("plain", {}).get("paired_reads") or []
    for who, key in (("cuca", "cuca_tps"), ("llama.cpp", "llama_tps")):
        shares = [achieved(per_tok, p[key], p["read_gbs"])["of_read_bandwidth"] for p in pairs]
        shares = [x for x in shares if x is not None]
        if shares:
            out[who]["of_read_bandwidth_paired"] = _rnd(median(shares), 3)
            out[who]["paired_samples"] = len(shares)
    if pairs:
        out["paired_source"] = ("per (read sample, plain decode run right after it) the achieved share; the median "
                                "over the llama.cpp section's interleaved runs")
    return out


def _attach_llama(res: dict[str, Any]) -> None:
    """Copy llama.cpp's figures next to cuca's per category, and its modelled speedups (from costs measured in
    this run) at the published level and at each curve point."""
    llama = res.get("llama", {})
    for cat, c in llama.get("categories", {}).items():
        mine = res.get("categories", {}).get(cat)
        if mine is not None:
            if c.get("spec_tps") is not None:
                mine["llama_spec_tps"] = c["spec_tps"]
                mine["llama_speedup"] = c.get("speedup")
                mine["llama_acceptance_rate"] = c.get("acceptance_rate")
    arch, n = res["arch"], res["draft_tokens"]
    level = PUBLISHED.get(arch)
    if level is not None:
        tpr = level.get("tokens_per_round", 1 + n * level.get("acceptance_rate", 0.0))
        at = llama_at_acceptance(llama, tpr, n)
        if at is not None:
            res["llama_published"] = at
    for p in res.get("curve", {}).get("points", []):
        if p.get("tokens_per_round") is not None:
            at = llama_at_acceptance(llama, p["tokens_per_round"], res["curve"]["draft_tokens"])
            if at is not None:
                p["llama_speedup_modelled"] = at["speedup"]


# ---- output -------------------------------------------------------------------------------------------------------
def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_report(res: dict[str, Any]) -> str:
    lines = [f"== {res['name']}: {res['model']} ({res['arch']})  drafter {res.get('drafter')}  "
             f"draft_tokens {res['draft_tokens']}  threads {res['threads']}  ISA {res.get('isa', '?')}  "
             f"{res['max_tokens']} tokens x {res['reps']} reps x {res['prompts_per_category']} prompts  "
             f"load average {res.get('load_average')} -> {res.get('load_average_end')}"]
    if res.get("controlled_probability") is not None:
        lines.append(f"controlled acceptance: P = {res['controlled_probability']:.3f} per draft")
    if res.get("acceptance_shape"):
        lines.append(res["acceptance_shape"])
    lines.append(f"{'category':8s} {'plain tok/s':>20s} {'spec tok/s':>20s} {'speedup':>8s} {'paired':>7s} "
                 f"{'accept':>7s} {'tok/round':>9s} {'rounds per length k=0..':>24s} {'llama spec':>10s} "
                 f"{'llama x':>8s}")
    for cat, c in res.get("categories", {}).items():
        pr, sr = c.get("plain_tps_range") or [0, 0], c.get("spec_tps_range") or [0, 0]
        pl = f"{_f(c.get('plain_tps'), '{:.1f}')} ({pr[0]:.1f}-{pr[1]:.1f})"
        sp = f"{_f(c.get('spec_tps'), '{:.1f}')} ({sr[0]:.1f}-{sr[1]:.1f})" if c.get("spec_tps") is not None else "-"
        lines.append(f"{cat:8s} {pl:>20s} {sp:>20s} {_f(c.get('speedup'), '{:.2f}x'):>8s} "
                     f"{_f(c.get('speedup_paired'), '{:.2f}x'):>7s} "
                     f"{_f(c.get('acceptance_rate'), '{:.0%}'):>7s} {_f(c.get('tokens_per_round')):>9s} "
                     f"{str(c.get('rounds_per_depth', '-')):>24s} {_f(c.get('llama_spec_tps')):>10s} "
                     f"{_f(c.get('llama_speedup'), '{:.2f}x'):>8s}")
    if "exact" in res:
        lines.append(f"greedy output equal to plain decoding: {res['exact']}; governed: {res.get('governed')}; "
                     f"governor decisions (kind, round, length): {res.get('governor_events')}")
        if res.get("warmup_requests"):
            lines.append(f"timed after {res['warmup_requests']} untimed warm-up request(s) (plain and speculative, "
                         f"longest prompt, a governor of their own) that first touch the memory the runs use")
    gm = res.get("governor")
    if gm:
        lines.append(f"governor model at the end: cost per round ms {gm['cost_ms']}, acceptance per position "
                     f"{gm['acceptance']}, modelled tok/s {gm['modelled_tps']}, length {gm['depth']}")
    if "sweep" in res:
        sw = res["sweep"]
        pts = "  ".join(f"n={p['draft_tokens']}: {_f(p['spec_tps'])} ({_f(p['speedup'], '{:.2f}x')})"
                        for p in sw["points"])
        lines.append(f"tokens/s vs draft_tokens (drafting every round; plain {_f(sw['plain_tps'])}): {pts}")
    if "curve" in res:
        lines.append(f"speedup vs acceptance (controlled, draft_tokens {res['curve']['draft_tokens']}, drafting every "
                     f"round):")
        lines.append(f"  {'P':>6s} {'accept':>7s} {'tok/round':>9s} {'plain':>7s} {'spec':>7s} {'cuca x':>7s} "
                     f"{'llama x (modelled)':>18s} {'pairs':>5s}")
        for p in res["curve"]["points"]:
            lines.append(f"  {p['probability']:6.3f} {_f(p['acceptance_rate'], '{:.0%}'):>7s} "
                         f"{_f(p['tokens_per_round']):>9s} {_f(p['plain_tps']):>7s} {_f(p['spec_tps']):>7s} "
                         f"{_f(p['speedup'], '{:.2f}x'):>7s} "
                         f"{_f(p.get('llama_speedup_modelled'), '{:.2f}x'):>18s} {p.get('pairs', '-'):>5}")
    if "llama_published" in res:
        lp = res["llama_published"]
        lines.append(f"llama.cpp at the published level ({lp['tokens_per_round']} tokens/round), MODELLED: "
                     f"{lp['speedup']:.2f}x (its round {lp['round_ms']:.1f} ms, plain step {lp['plain_ms']:.1f} ms, "
                     "both measured in this run)")
    if "poor_drafter" in res:
        pd = res["poor_drafter"]
        lines.append(f"poorly-accepted drafter (P={pd['probability']}), governed vs plain side by side: "
                     f"medians {_f(pd['governed_tps'])} vs {_f(pd['plain_tps'])} tok/s; median of the "
                     f"{pd.get('pairs', '')} back-to-back pairs' ratios {_f(pd['ratio'], '{:.3f}x')} "
                     f"(target >= 0.98: {'pass' if pd['passed'] else 'FAIL'}); after {pd['warmup_requests']} warm-up "
                     f"requests at {pd['warmup_governed_tps']} tok/s (all governed requests: "
                     f"{_f(pd.get('ratio_including_warmup'), '{:.3f}x')}); decisions while timed: "
                     f"{pd['governor_events_timed']}")
    llama = res.get("llama")
    if llama and "skipped" in llama:
        lines.append(f"llama.cpp: skipped ({llama['skipped']})")
    elif llama and "pass_cost" in llama:
        pk = llama.get("peer", {})
        lines.append(f"llama.cpp: {peer_build(llama)} build {pk.get('pin')} at {pk.get('bin')}")
        lp = llama.get("plain")
        if lp:
            lines.append(f"llama.cpp plain decode (llama-bench {lp['label']}, one figure for every category: it "
                         f"decodes no prompt): {_f(lp['plain_tps'])} tok/s ({lp['plain_tps_range'][0]:.1f}-"
                         f"{lp['plain_tps_range'][1]:.1f}); cuca plain at the same time "
                         f"{_f(lp['cuca_plain_tps_same_time'])} = {_f(lp['cuca_over_llama_plain'], '{:.2f}x')}")
        if llama.get("spec_skipped"):
            lines.append(f"llama.cpp speculation: {llama['spec_skipped']}")
        pc = llama["pass_cost"]
        ms = list(pc.get("cuca", {}))
        lines.append("M-row pass cost vs M=1:  " + "  ".join(f"M={m}" for m in ms))
        for who in pc:
            lines.append(f"  {who:26s} " + "  ".join(f"{pc[who].get(m, float('nan')):4.2f}" for m in ms)
                         + f"   (M=1: {llama['pass_ms'][who]['1']:.1f} ms)")
    bw = res.get("bandwidth")
    if bw:
        rd = bw["read"]
        samples = " / ".join(f"{x:.1f}" for x in rd.get("samples", []))
        lines.append(f"read bandwidth in this run: {_f(rd.get('gbs'))} GB/s ({rd.get('threads', '-')} threads; median"
                     f" of {samples} at the start, middle, end)" if "gbs" in rd
                     else f"read bandwidth: {rd.get('skipped')}")
        for who in ("cuca", "llama.cpp"):
            e = bw[who]
            paired = (f"; paired with a read sample before each run: {_f(e['of_read_bandwidth_paired'], '{:.0%}')} "
                      f"(median of {e['paired_samples']})" if e.get("of_read_bandwidth_paired") is not None else "")
            lines.append(f"  {who:10s} decode {_f(e['plain_tps'])} tok/s x {bw['weight_bytes_per_token'] / 1e6:.1f} "
                         f"MB/token = {_f(e['gbs'])} GB/s ({_f(e['of_read_bandwidth'], '{:.0%}')} of read{paired})")
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
            ax.axhline(lp["speedup"], color="C1", ls="--", label="llama.cpp at the published level (modelled)")
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
            lp = [p for p in pts if p.get("llama_speedup_modelled") is not None]
            if lp:
                ax.plot([p["acceptance_rate"] for p in lp], [p["llama_speedup_modelled"] for p in lp], "s--",
                        label="llama.cpp (modelled from its costs measured in this run)")
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
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or torch-cpu (LocalModelConfig.device)")
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
    p.add_argument("--no-llama", action="store_true", help="skip llama.cpp (its native build, peer.py)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the read bandwidth and achieved GB/s")
    p.add_argument("--quick", action="store_true", help="1 rep, 1 prompt per category, 32 tokens, short sweep")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--png", default=None, help="write a chart here (needs matplotlib: pip install cuca[bench])")
    p.add_argument("--all", action="store_true", help="the full report (benchmarks/report.py) into --out")
    p.add_argument("--out", default="report", help="folder for --all")


def options_from_args(a: argparse.Namespace) -> BenchOptions:
    o = BenchOptions(a.model, a.drafter, a.draft_tokens, a.threads, a.reps, a.max_tokens, a.prompts,
                     not a.no_governor, a.controlled, list(a.acceptance), list(a.sweep), poor_drafter=a.poor_drafter,
                     llama=not a.no_llama, bandwidth=not a.no_bandwidth, device=a.device)
    if a.quick:
        o.reps, o.prompts_per_category, o.max_tokens, o.poor_warmup, o.poor_reps = 1, 1, 32, 1, 1
        o.sweep = [n for n in o.sweep if n in (1, 3)] or list(o.sweep)[:1]
    return o


def run_bench(a: argparse.Namespace) -> int:
    """Run `cuca bench` from parsed arguments; returns the exit status."""
    if a.all:
        report = Path(__file__).resolve().parents[2] / "benchmarks" / "report.py"
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
        from ..gguf import open_gguf
        from ..sources import ModelSource

        arch = open_gguf(ModelSource.parse(a.model).resolve()).architecture
        p = published_probability(arch, o.draft_tokens)
        if p is None:
            print(f"cuca bench: no published acceptance level for architecture {arch!r}", file=sys.stderr)
            return 2
        o.controlled = p
        o.acceptance = sorted(set(o.acceptance) | {0.0, round(p, 4), 1.0})
    log: Log = stderr_log
    from ..errors import CucaError

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


def peer_build(llama: dict[str, Any]) -> str:
    """'AVX2-only' or 'native': which llama.cpp build a pair's figures came from (its BUILD-INFO's ISA line)."""
    info = (llama or {}).get("peer", {}).get("build_info") or []
    isa = next((x for x in info if x.startswith("ISA=")), "")
    return "AVX2-only" if isa.startswith("ISA=avx2") else "native"
