"""llama.cpp's logits on the tiny synthetic qwen35 model: tests/fixtures/qwen35_llamacpp.npz.

Run with the environment that has llama-cpp-python (its llama.cpp knows `qwen35`):
    /work/venv/bin/python tools/make_qwen35_llamacpp_fixture.py

Same file as the transformers fixture (tools/synth_qwen35.py TINY, F32, seed 0), same 40-token prompt, then the
same 20 tokens decoded one at a time; logits of every row. (llama-cpp-python does not expose llama.cpp's MTP
context inputs, so the head is checked against the spec-derived reference only.)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import synth_qwen35 as S  # noqa: E402


def main() -> None:
    golden = np.load(ROOT / "tests" / "fixtures" / "qwen35_golden.npz")
    prompt, decode = golden["prompt"].tolist(), golden["decode"].tolist()
    with tempfile.TemporaryDirectory() as d:
        path = S.write(Path(d) / "tiny.gguf", S.TINY, seed=0)
        llm = llama_cpp.Llama(str(path), n_threads=1, n_ctx=128, logits_all=True, verbose=False)
        llm.eval(prompt)
        rows = [np.array(llm.scores[: len(prompt)], np.float32)]
        for t in decode:
            llm.eval([t])
            rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens], np.float32))
        del llm
    logits = np.concatenate(rows)
    dst = ROOT / "tests" / "fixtures" / "qwen35_llamacpp.npz"
    np.savez_compressed(dst, logits=logits, llama_cpp_version=np.array(llama_cpp.__version__))
    print(f"wrote {dst}: {logits.shape}, llama-cpp-python {llama_cpp.__version__}")


if __name__ == "__main__":
    main()
