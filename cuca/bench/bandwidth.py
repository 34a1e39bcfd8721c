"""Decode against the bandwidth limit: the machine's read bandwidth now (benchmarks/read_bandwidth.c, compiled once
with the system C compiler) and the weight bytes a decode step reads, so that each engine's achieved GB/s
(weight bytes per token x tok/s) sits beside it in the same run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parents[2] / "benchmarks" / "read_bandwidth.c"


def weight_bytes_per_token(path: str | os.PathLike[str]) -> int:
    """Bytes of weights one decode step reads: every matrix (2-D or more), except tables read by row lookup (token
    and per-layer embeddings), plus the tied embedding once as the LM head when there is no output.weight."""
    from ..gguf import open_gguf

    f = open_gguf(path)
    total, tied = 0, "output.weight" not in f.tensors
    for t in f:
        if len(t.shape) < 2:
            continue
        if "token_embd" in t.name:  # token_embd.weight, per_layer_token_embd.weight: lookups
            if t.name == "token_embd.weight" and tied:
                total += t.nbytes
            continue
        total += t.nbytes
    return total


def read_bandwidth(threads: int, mib: int = 1024) -> dict[str, Any]:
    """GB/s of a plain read sweep at `threads` threads (best of 5), or {"skipped": why}."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not SOURCE.is_file():
        return {"skipped": "no C compiler or no benchmarks/read_bandwidth.c (a source checkout)"}
    exe = Path(tempfile.gettempdir()) / f"cuca-read-bandwidth-{os.getuid()}"
    cmd = [cc, "-O3", "-march=native", "-fopenmp", str(SOURCE), "-o", str(exe)]
    try:
        if not exe.is_file() or exe.stat().st_mtime < SOURCE.stat().st_mtime:
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        p = subprocess.run([str(exe), str(mib), str(threads)], check=True, capture_output=True, text=True,
                           timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return {"skipped": f"read_bandwidth failed: {e}"}
    m = re.search(r"threads\s+\d+:\s+([0-9.]+)\s+GB/s", p.stdout)
    if m is None:
        return {"skipped": f"read_bandwidth printed {p.stdout[:200]!r}"}
    return {"gbs": float(m.group(1)), "threads": threads,
            "source": f"benchmarks/read_bandwidth.c ({' '.join(cmd[1:4])}), {mib} MiB, best of 5, this run"}


def achieved(bytes_per_token: int, tps: float | None, read_gbs: float | None) -> dict[str, Any]:
    """GB/s that `tps` tokens/s imply, and the fraction of the measured read bandwidth."""
    if tps is None or tps != tps:
        return {"gbs": None, "of_read_bandwidth": None}
    gbs = bytes_per_token * tps / 1e9
    return {"gbs": round(gbs, 2), "of_read_bandwidth": round(gbs / read_gbs, 3) if read_gbs else None}
