"""The benchmark machinery (cuca.bench) on a tiny synthetic Gemma 4 pair: the JSON's structure, controlled acceptance
yielding the chosen acceptance, llama.cpp's speculative loop staying exact. No timing assertions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from synth_gemma4 import write_gemma4, write_gemma4_assistant

from cuca import bench as B
from cuca.speculative.governor import AlwaysDraft, SpeedGovernor
from cuca.speculative.proposal import Proposal


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("bench")
    return write_gemma4(d / "g4.gguf"), write_gemma4_assistant(d / "a.gguf")


@pytest.fixture(scope="module")
def bench(pair: tuple[Path, Path]) -> B.Bench:
    return B.Bench(pair[0], str(pair[1]), draft_tokens=3, threads=1, n_ctx=256)


def test_probability_for_published_levels() -> None:
    p = B.probability_for(3, acceptance_rate=0.48)
    assert B.expected_rate(p, 3) == pytest.approx(0.48, abs=1e-9)
    q = B.probability_for(3, tokens_per_round=2.7)
    assert 1 + 3 * B.expected_rate(q, 3) == pytest.approx(2.7, abs=1e-9)
    assert B.published_probability("gemma4") == pytest.approx(p)
    assert B.published_probability("llama") is None
    assert B.probability_for(1, acceptance_rate=0.3) == pytest.approx(0.3, abs=1e-9)


class _Fixed:
    def begin(self, prompt, params, rng):  # type: ignore[no-untyped-def]
        pass

    def commit(self, tokens, positions, hidden):  # type: ignore[no-untyped-def]
        pass

    def propose(self, n: int) -> Proposal:
        self.calls = getattr(self, "calls", 0) + 1
        return Proposal([7] * n, None)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.675, 1.0])
def test_controlled_drafter_statistics(p: float) -> None:
    """Each draft equals the reference with probability p (and is otherwise wrong); the inner drafter always runs."""
    inner = _Fixed()
    d = B.ControlledDrafter(inner, p)
    ref = [int(x) for x in np.random.default_rng(1).integers(0, 50, 4000)]
    d.expect(5, ref, seed=3)
    hits = total = 0

    def at(k: int) -> B.ControlledDrafter:  # committed up to the token before reference index k
        d.commit([0], np.array([5 + k - 2], np.int32), np.zeros((1, 0), np.float32))
        return d

    for k in range(1, 3990, 3):
        drafts = at(k).propose(3).tokens
        assert len(drafts) == 3
        hits += sum(int(t == r) for t, r in zip(drafts, ref[k : k + 3], strict=True))
        total += 3
    assert inner.calls == len(range(1, 3990, 3))
    assert hits / total == pytest.approx(p, abs=0.03)
    assert len(at(3999).propose(3).tokens) == 1  # drafts stop at the reference's end


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_controlled_acceptance_in_real_rounds(bench: B.Bench, p: float) -> None:
    """With draft_tokens 1 the acceptance rate is the chosen probability; output stays equal to plain decoding."""
    rates, runs = [], []
    for i, text in enumerate(B.PROMPTS["prose"]):
        ids = bench.encode(text)
        plain = bench.plain(ids, 64)
        r = bench.spec(ids, 64, B.AlwaysDraft(), draft_tokens=1, control=B.Controlled(p, plain.tokens, i))
        assert r.tokens == plain.tokens
        assert r.stats is not None
        rates.append(r.stats.acceptance_rate())
        runs.append(r)
    s = B._draft_summary(runs)
    if p in (0.0, 1.0):
        assert s["acceptance_rate"] == p
        assert s["tokens_per_round"] == 1 + p
    else:
        assert s["acceptance_rate"] == pytest.approx(p, abs=0.15)  # ~100 rounds


def test_curve_sweep_and_poor_drafter_structure(bench: B.Bench) -> None:
    prompts = [B.PROMPTS[c][0] for c in B.CATEGORIES]
    curve = B.run_curve(bench, prompts[:1], [0.0, 1.0], B.Workload(24), reps_at={1.0 - 1e-5: 2})
    assert [pt["acceptance_rate"] for pt in curve["points"]] == [0.0, 1.0]
    assert [pt["pairs"] for pt in curve["points"]] == [1, 2]  # the headline level gets more pairs
    sweep = B.run_sweep(bench, prompts[:1], [1, 2], 16)
    assert [pt["draft_tokens"] for pt in sweep["points"]] == [1, 2]
    poor = B.run_poor_drafter(bench, prompts[:1], B.Workload(48, reps=1), warmup=1)
    assert poor["accepted"] == 0
    assert {"plain_tps", "governed_tps", "ratio", "passed", "governor_events_timed"} <= set(poor)
    kinds = ("spec_on", "spec_off", "probe", "refresh", "depth")
    assert all(kind in kinds for kind, _, _ in poor["governor_events_all"])
    assert "cost_ms" in poor["governor"] and "modelled_tps" in poor["governor"]


def test_cli_json_structure(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc = B.main([str(pair[0]), "--drafter", str(pair[1]), "--quick", "--no-llama", "--threads", "1", "--json",
                 "--published", "--sweep", "2", "--max-tokens", "16"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["categories"]) == {"code", "list", "prose"}
    for c in res["categories"].values():
        assert {"plain_tps", "spec_tps", "speedup", "speedup_paired", "acceptance_rate", "tokens_per_round"} <= set(c)
        assert c["plain_tps"] > 0 and c["spec_tps"] > 0 and c["speedup_paired"] > 0
    assert res["exact"] is True
    assert res["controlled_probability"] == pytest.approx(B.published_probability("gemma4"))
    assert [p["probability"] for p in res["curve"]["points"]][::2] == [0.0, 1.0]
    assert res["sweep"]["points"][0]["draft_tokens"] == 2
    assert "categories" in res and "code" in B.format_report(res)


def test_add_bench_parser() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    B.add_bench_parser(sub)
    a = ap.parse_args(["bench", "m.gguf", "--drafter", "in-trunk", "--acceptance", "0", "0.5", "--json"])
    assert a.cmd == "bench" and a.model == "m.gguf" and a.acceptance == [0.0, 0.5] and a.json
    o = B.options_from_args(a)
    assert o.drafter == "in-trunk" and o.max_tokens == 128 and o.governed


def test_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = {"name": "x", "arch": "gemma4", "controlled_probability": 0.6,
           "categories": {c: {"speedup": 1.1, "llama_speedup": 0.9} for c in B.CATEGORIES},
           "sweep": {"plain_tps": 10.0, "points": [{"draft_tokens": n, "spec_tps": 9.0 + n} for n in (1, 2)]},
           "curve": {"draft_tokens": 3, "points": [{"acceptance_rate": a, "speedup": 0.5 + a, "llama_speedup": a}
                                                   for a in (0.0, 0.5, 1.0)]}}
    B.plot([res], tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


BENCH_JSON = """[
  {"build_commit": "0c1e570", "model_filename": "m.gguf", "n_threads": 2, "n_prompt": 4, "n_gen": 0,
   "avg_ns": 3000000, "samples_ns": [2000000, 4000000], "samples_ts": [2000.0, 1000.0]},
  {"build_commit": "0c1e570", "model_filename": "m.gguf", "n_threads": 2, "n_prompt": 0, "n_gen": 16,
   "avg_ns": 200000000, "samples_ns": [200000000], "samples_ts": [80.0]}
]"""

SPEC_OUT = """main: loading
encoded   12 tokens in    0.050 seconds, speed:  240.000 t/s
decoded  130 tokens in    5.000 seconds, speed:   26.000 t/s

n_draft   = 3
n_predict = 130
n_drafted = 150
n_accept  = 80
accept    = 53.333%
"""


class _Short(_Fixed):
    """Proposes 0, 1 or 2 drafts (fewer than asked), by how long the committed history is."""

    def commit(self, tokens, positions, hidden):  # type: ignore[no-untyped-def]
        self.history_len = int(positions[-1]) + 2

    def propose(self, n: int) -> Proposal:
        return Proposal([7] * (self.history_len % 3), None)


def test_controlled_drafter_proposes_no_more_than_the_inner_drafter() -> None:
    d = B.ControlledDrafter(_Short(), 1.0)
    d.expect(2, list(range(100)), seed=0)
    for k in range(3, 30):
        d.commit([0], np.array([k - 2], np.int32), np.zeros((1, 4), np.float32))  # the history is k tokens long
        assert len(d.propose(3).tokens) == k % 3
    assert "P^i" in B.ACCEPTANCE_SHAPE and "never padded" in B.ACCEPTANCE_SHAPE


def test_parse_llama_bench_output() -> None:
    recs = B.parse_llama_bench("llama-bench: some log line\n" + BENCH_JSON)
    assert [(r["n_prompt"], r["n_gen"]) for r in recs] == [(4, 0), (0, 16)]
    assert recs[0]["samples_ms"] == [2.0, 4.0] and recs[1]["samples_tps"] == [80.0]
    assert recs[0]["build_commit"] == "0c1e570"
    with pytest.raises(B.PeerError):
        B.parse_llama_bench("no json here")
    with pytest.raises(B.PeerError):
        B.parse_llama_bench('[{"n_prompt": 1}]')


def test_parse_speculative_and_the_modelled_speedup() -> None:
    r = B.parse_speculative(SPEC_OUT)
    assert (r["decoded"], r["n_drafted"], r["n_accept"], r["rounds"]) == (130, 150, 80, 50)
    assert r["round_ms"] == pytest.approx(100.0) and r["tokens_per_round"] == pytest.approx(2.6)
    with pytest.raises(B.PeerError):
        B.parse_speculative("crashed")
    llama = {"spec_round_ms": 100.0, "plain_step_ms": 40.0, "categories": {"code": {"n_draft": 3}}}
    at = B.llama_at_acceptance(llama, 2.5, 3)
    assert at is not None and at["modelled"] and at["speedup"] == pytest.approx(1.0)
    assert B.llama_at_acceptance(llama, 2.5, 2) is None  # measured at another round length: not modelled
    assert B.llama_at_acceptance({"categories": {}}, 2.5, 3) is None


def test_weight_bytes_per_token(pair: tuple[Path, Path]) -> None:
    from cuca.bench.bandwidth import achieved
    from cuca.gguf import open_gguf

    f = open_gguf(pair[0])
    n = B.weight_bytes_per_token(pair[0])
    lookups = sum(t.nbytes for t in f if "token_embd" in t.name and t.name != "token_embd.weight")
    assert 0 < n <= sum(t.nbytes for t in f if len(t.shape) >= 2) - lookups
    a = achieved(1_000_000_000, 20.0, 40.0)
    assert a == {"gbs": 20.0, "of_read_bandwidth": 0.5}


def test_bandwidth_share_paired_with_read_samples(pair: tuple[Path, Path]) -> None:
    """Each read sample divides the plain runs right after it: the median of those shares, beside the share of the
    medians."""
    from cuca.bench.report import _bandwidth

    tps = 1e10 / B.weight_bytes_per_token(pair[0])  # 10 GB/s of weights
    reads = [20.0, 10.0, 40.0]  # the machine's read rate moving within the run
    res = {"categories": {"code": {"plain_tps": tps}},
           "llama": {"plain": {"plain_tps": 0.8 * tps, "paired_reads": [
               {"read_gbs": r, "cuca_tps": tps, "llama_tps": 0.8 * tps} for r in reads]}}}
    bw = _bandwidth(res, pair[0], [{"gbs": 25.0}])
    assert bw["cuca"]["of_read_bandwidth"] == 0.4 and bw["llama.cpp"]["of_read_bandwidth"] == 0.32
    assert bw["cuca"]["of_read_bandwidth_paired"] == 0.5 and bw["llama.cpp"]["of_read_bandwidth_paired"] == 0.4
    assert bw["cuca"]["paired_samples"] == 3
    alone = _bandwidth({"categories": res["categories"]}, pair[0], [{"gbs": 25.0}])  # no llama.cpp section
    assert "of_read_bandwidth_paired" not in alone["cuca"]


def test_native_peer_runs_when_built() -> None:
    """The native llama.cpp build (benchmarks/peer/build_llamacpp.sh), when present, gives same-run figures."""
    if B.peer_bin() is None:
        pytest.skip("no native llama.cpp build (benchmarks/peer/build_llamacpp.sh)")
    from conftest import real_model_path

    peer = B.find_peer(1)
    assert peer is not None
    path = real_model_path("smollm2")
    d = peer.decode(path, 4)
    assert d["samples_tps"][0] > 0 and "llama-bench" in d["source"]
    pm = peer.pass_ms(path, [1, 2], 1)
    assert set(pm["ms"]) == {"1", "2"}


def test_peer_finds_pinned_builds_and_reports_their_own_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build made with CUCA_PEER_PIN is found under that pin, and Peer.info() names the build's own version (from
    its BUILD-INFO or folder), not the default pin; a build elsewhere without either says it is unknown."""

    def build(root: Path, info: str | None) -> Path:
        b = root / "build" / "bin"
        b.mkdir(parents=True)
        (b / "llama-bench").write_text("")
        if info is not None:
            (root / "BUILD-INFO").write_text(info)
        return b

    other = build(tmp_path / "llama-cpp-python-0.3.99", "llama-cpp-python 0.3.99\nversion: 1 (abc)\n")
    monkeypatch.delenv("CUCA_LLAMA_BIN", raising=False)
    monkeypatch.setenv("CUCA_PEER_CACHE", str(tmp_path))
    monkeypatch.delenv("CUCA_PEER_PIN", raising=False)
    assert B.peer_pin() == B.peer.PEER_PIN and B.peer_bin() is None  # only the other pin was built here
    monkeypatch.setenv("CUCA_PEER_PIN", "0.3.99")
    assert B.peer_bin() == other
    info = B.Peer(other, 1).info()
    assert info["pin"].startswith("llama-cpp-python==0.3.99") and info["build_info"][0] == "llama-cpp-python 0.3.99"
    folder_only = build(tmp_path / "llama-cpp-python-0.4.0", None)
    assert B.Peer(folder_only, 1).info()["pin"].startswith("llama-cpp-python==0.4.0")
    # an AVX2-only build beside the native one: the peer of an AVX2 build of the kernels, with its own BUILD-INFO
    avx2 = tmp_path / "llama-cpp-python-0.3.99" / "build-avx2"
    (avx2 / "bin").mkdir(parents=True)
    (avx2 / "bin" / "llama-bench").write_text("")
    (avx2 / "BUILD-INFO").write_text("llama-cpp-python 0.3.99\nversion: 1 (abc)\nISA=avx2\n")
    monkeypatch.setattr("cuca.kernels.ISA", "avx2")
    assert B.peer_bin() == avx2 / "bin" and B.Peer(avx2 / "bin", 1).info()["build_info"][-1] == "ISA=avx2"
    monkeypatch.setattr("cuca.kernels.ISA", "avx512")
    assert B.peer_bin() == other
    custom = build(tmp_path / "mine", None)
    monkeypatch.setenv("CUCA_LLAMA_BIN", str(custom))
    assert B.peer_bin() == custom and B.Peer(custom, 1).info()["pin"].startswith("unknown build")


def test_categories_paired_speedup_is_the_median_of_per_request_ratios() -> None:
    """`speedup_paired` pairs each speculative request with the plain run just before it; `speedup` divides the
    medians. A machine that speeds up between prompts moves the two apart: 2.0x and 1.1x per pair give a paired
    1.55x, the medians 65 / 55 = 1.18x."""
    class Timed:
        def __init__(self) -> None:
            self.plain_tps, self.spec_tps = iter([10.0, 100.0]), iter([20.0, 110.0])

        def encode(self, text: str) -> list[int]:
            return [1, 2, 3]

        def plain(self, ids: list[int], max_tokens: int) -> B.Run:
            return B.Run(next(self.plain_tps), [7])

        def spec(self, ids: list[int], max_tokens: int, governor: object, control: object = None) -> B.Run:
            return B.Run(next(self.spec_tps), [7])

    res = B.run_categories(Timed(), {"code": ["a", "b"]}, B.Workload(max_tokens=4),  # type: ignore[arg-type]
                           governed=False, warmup=0)
    c = res["categories"]["code"]
    assert c["speedup_paired"] == pytest.approx(1.55) and c["speedup"] == pytest.approx(65 / 55, abs=1e-3)
    assert res["exact"] is True


def test_categories_warm_up_is_untimed_and_on_the_longest_prompt() -> None:
    """The warm-up requests (a plain and a speculative one per `warmup`) run first, on the longest prompt, with a
    governor of their own, and their rates appear in no figure."""
    seen: list[tuple[str, int, object]] = []

    class Timed:
        def __init__(self) -> None:
            self.plain_tps, self.spec_tps = iter([1.0, 10.0, 20.0]), iter([1.0, 30.0, 40.0])

        def encode(self, text: str) -> list[int]:
            return [1] * len(text)

        def plain(self, ids: list[int], max_tokens: int) -> B.Run:
            seen.append(("plain", len(ids), None))
            return B.Run(next(self.plain_tps), [7])

        def spec(self, ids: list[int], max_tokens: int, governor: object, control: object = None) -> B.Run:
            seen.append(("spec", len(ids), governor))
            return B.Run(next(self.spec_tps), [7])

    res = B.run_categories(Timed(), {"code": ["a"], "list": ["bbb"]}, B.Workload(max_tokens=4),  # type: ignore[arg-type]
                           governed=True, warmup=1)
    assert [k for k, _, _ in seen[:2]] == ["plain", "spec"] and seen[0][1] == seen[1][1] == 3
    assert isinstance(seen[1][2], AlwaysDraft) and isinstance(seen[3][2], SpeedGovernor)
    cats = res["categories"]
    assert cats["code"]["plain_tps"] == 10.0 and cats["code"]["spec_tps"] == 30.0 and cats["list"]["spec_tps"] == 40.0
    assert res["warmup_requests"] == 1 and len(seen) == 6
