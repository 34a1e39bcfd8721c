"""The peer: llama.cpp at full strength, its own native build (benchmarks/peer/build_llamacpp.sh: the llama.cpp tree
vendored in the pinned llama-cpp-python sdist, GGML_NATIVE, CPU repacking on), run on the same files in the same
bench run as cuca. Plain decode from `llama-bench -n`, the cost of an M-row pass from `llama-bench -p M`, its own
speculation from `llama-speculative-simple`. Every figure carries its provenance (tool, command, build)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEER_PIN = "0.3.36"  # llama-cpp-python's sdist, whose vendored llama.cpp is the peer
TOOLS = ("llama-bench", "llama-server", "llama-speculative-simple", "llama-completion")
BUILD_SCRIPT = "benchmarks/peer/build_llamacpp.sh"
TIMEOUT_S = 1800


class PeerError(RuntimeError):
    """A peer tool failed or printed something this parser does not know."""


def peer_pin() -> str:
    """The llama-cpp-python version the build script builds: $CUCA_PEER_PIN (as the script reads it), else PEER_PIN."""
    return os.environ.get("CUCA_PEER_PIN") or PEER_PIN


def peer_bin() -> Path | None:
    """The folder with the native tools: $CUCA_LLAMA_BIN, else the build script's cache folder for peer_pin() (for
    an AVX2 build of cuca's kernels, the AVX2-only llama.cpp build first, when built: the same SIMD width); None if
    absent."""
    from ..kernels import ISA

    env = os.environ.get("CUCA_LLAMA_BIN")
    root = Path(os.environ.get("CUCA_PEER_CACHE", "~/.cache/cuca-peer")).expanduser() / f"llama-cpp-python-{peer_pin()}"
    builds = (["build-avx2"] if ISA == "avx2" else []) + ["build"]
    for d in ([Path(env)] if env else []) + [root / b / "bin" for b in builds]:
        if (d / "llama-bench").is_file():
            return d
    return None


def build_pin(bin_dir: Path, build_info: list[str] | None) -> str | None:
    """Which llama-cpp-python version a build came from: the first line of its BUILD-INFO ("llama-cpp-python X",
    written by the build script), else its folder's name (llama-cpp-python-X/build/bin); None if neither says."""
    if build_info:
        m = re.fullmatch(r"llama-cpp-python\s+(\S+)", build_info[0].strip())
        if m:
            return m.group(1)
    m = re.fullmatch(r"llama-cpp-python-(.+)", bin_dir.parent.parent.name)
    return m.group(1) if m and bin_dir.name == "bin" and bin_dir.parent.name in ("build", "build-avx2") else None


def parse_llama_bench(text: str) -> list[dict[str, Any]]:
    """llama-bench `-o json` output -> one record per test: n_prompt, n_gen, n_threads, samples_ms (one per
    repetition), samples_tps, build_commit."""
    try:
        raw = json.loads(text[text.index("[") : text.rindex("]") + 1])
    except (ValueError, json.JSONDecodeError) as e:
        raise PeerError(f"llama-bench printed no JSON array: {text[:200]!r}") from e
    out = []
    for r in raw:
        try:
            out.append({"n_prompt": int(r["n_prompt"]), "n_gen": int(r["n_gen"]), "n_threads": int(r["n_threads"]),
                        "samples_ms": [float(v) / 1e6 for v in r["samples_ns"]],
                        "samples_tps": [float(v) for v in r["samples_ts"]],
                        "build_commit": str(r.get("build_commit", "")), "model": str(r.get("model_filename", ""))})
        except (KeyError, TypeError, ValueError) as e:
            raise PeerError(f"llama-bench record without {e}: {r!r}"[:300]) from e
    return out


_SPEC_NUM = {"n_draft": r"n_draft\s*=\s*(\d+)", "n_predict": r"n_predict\s*=\s*(\d+)",
             "n_drafted": r"n_drafted\s*=\s*(\d+)", "n_accept": r"n_accept\s*=\s*(\d+)"}
_SPEC_DEC = r"decoded\s+(\d+)\s+tokens in\s+([0-9.]+)\s+seconds, speed:\s+([0-9.]+)\s+t/s"


def parse_speculative(text: str) -> dict[str, Any]:
    """llama-speculative-simple's closing lines -> decoded tokens, seconds, tok/s, drafted, accepted, rounds (each
    verify yields its accepted drafts + 1, so rounds = decoded - accepted) and ms per round."""
    m = re.search(_SPEC_DEC, text)
    if m is None:
        raise PeerError(f"llama-speculative-simple printed no 'decoded N tokens' line: {text[-300:]!r}")
    out: dict[str, Any] = {"decoded": int(m.group(1)), "seconds": float(m.group(2)), "tps": float(m.group(3))}
    for k, pat in _SPEC_NUM.items():
        g = re.search(pat, text)
        if g is None:
            raise PeerError(f"llama-speculative-simple printed no {k}: {text[-300:]!r}")
        out[k] = int(g.group(1))
    rounds = max(1, out["decoded"] - out["n_accept"])
    out.update(rounds=rounds, round_ms=out["seconds"] * 1e3 / rounds,
               acceptance_rate=out["n_accept"] / out["n_drafted"] if out["n_drafted"] else None,
               tokens_per_round=out["decoded"] / rounds)
    return out


@dataclass
class Peer:
    """The native tools in `bin`, run with `threads` threads."""

    bin: Path
    threads: int

    def info(self) -> dict[str, Any]:
        """Where the tools are and which build they are (the pin read from the build itself, not assumed)."""
        # the build folder's own BUILD-INFO (an ISA-specific build), else the one beside the sources
        f = next((g for g in (self.bin.parent / "BUILD-INFO", self.bin.parent.parent / "BUILD-INFO") if g.is_file()),
                 None)
        lines = f.read_text().strip().splitlines() if f is not None else None
        pin = build_pin(self.bin, lines)
        return {"bin": str(self.bin),
                "pin": f"llama-cpp-python=={pin} (vendored llama.cpp)" if pin else
                f"unknown build (no BUILD-INFO or llama-cpp-python-<version> folder around {self.bin})",
                "build_info": lines, "built_by": BUILD_SCRIPT}

    def _run(self, tool: str, args: Sequence[str]) -> tuple[str, str]:
        cmd = [str(self.bin / tool), *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PeerError(f"{tool}: {e}") from e
        if p.returncode != 0:
            raise PeerError(f"{tool} exited {p.returncode}: {(p.stderr or p.stdout)[-400:]}")
        return p.stdout + p.stderr, shlex.join([tool, *args])

    def bench(self, model: Path, prompt: Sequence[int], gen: Sequence[int], reps: int) -> tuple[list[dict], str]:
        """llama-bench records (and the command) for prompt sizes `prompt` and generation lengths `gen`."""
        args = ["-m", str(model), "-t", str(self.threads), "-r", str(reps), "-o", "json",
                "-p", ",".join(str(p) for p in prompt) or "0", "-n", ",".join(str(n) for n in gen) or "0"]
        text, cmd = self._run("llama-bench", args)
        return parse_llama_bench(text), cmd

    def decode(self, model: Path, n: int, reps: int = 1) -> dict[str, Any]:
        """Plain decode tok/s (llama-bench tg, one sample per repetition), with provenance."""
        recs, cmd = self.bench(model, [], [n], reps)
        r = next(x for x in recs if x["n_gen"] == n)
        return {"samples_tps": r["samples_tps"], "source": f"llama-bench tg{n} (native build), this run: {cmd}",
                "build_commit": r["build_commit"]}

    def pass_ms(self, model: Path, ms: Sequence[int], reps: int) -> dict[str, Any]:
        """Wall ms of one M-row batch from an empty context (llama-bench ppM: logits of the last row only)."""
        recs, cmd = self.bench(model, list(ms), [], reps)
        best = {str(r["n_prompt"]): min(r["samples_ms"]) for r in recs if r["n_gen"] == 0}
        return {"ms": best, "source": f"llama-bench pp M (native build; best of {reps}; logits of the last row "
                f"only, as llama-bench computes them), this run: {cmd}", "build_commit": recs[0]["build_commit"]}

    def speculative(self, model: Path, spec_type: str, prompt: str, n: int, n_draft: int,
                    draft_model: Path | None = None) -> dict[str, Any]:
        """llama.cpp's own speculation (llama-speculative-simple, greedy) on the same pair, with provenance."""
        args = ["-m", str(model), "-p", prompt, "-n", str(n), "-t", str(self.threads), "--temp", "0", "--top-k", "1",
                "--seed", "1", "-c", "2048", "--spec-type", spec_type, "--spec-draft-n-max", str(n_draft)]
        if draft_model is not None:
            args += ["-md", str(draft_model)]
        if spec_type == "ngram-simple":  # its draft length is its m-gram size (default 48), not --spec-draft-n-max
            args += ["--spec-ngram-simple-size-m", str(n_draft)]
        text, cmd = self._run("llama-speculative-simple", args)
        out = parse_speculative(text)
        out["source"] = f"llama-speculative-simple (native build), this run: {cmd}"
        return out


def find_peer(threads: int) -> Peer | None:
    b = peer_bin()
    return None if b is None else Peer(b, threads)


def spec_type_for(drafter_kind: str | None) -> str | None:
    """llama.cpp's speculation type for cuca's drafter kind (None: it has no counterpart here)."""
    return {"prompt_lookup": "ngram-simple", "in_trunk": "draft-mtp", "file": "draft-mtp",
            "draft_model": "draft-simple"}.get(drafter_kind or "")
