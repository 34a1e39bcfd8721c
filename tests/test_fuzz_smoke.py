"""Issue 13: a bounded run of tools/fuzz_gguf.py (CI smoke). Every case must end in a CucaError, a clean load or
a generation: any other exception, a signal, a hang or a run over 2 GiB fails the test. The long campaign is in
the README."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fuzz_smoke_only_typed_errors_loads_and_generations(tmp_path: Path) -> None:
    # a fresh process: the fuzzer forks, which needs a parent that has not started kernel threads yet
    cmd = [sys.executable, str(ROOT / "tools" / "fuzz_gguf.py"), "--cases", "240", "--seed", "7", "--jobs", "2",
           "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "240 cases (0..239)" in summary and "exception 0, signal 0, hang 0, memory 0" in summary, summary
    assert "generated" in summary and " typed " in summary
