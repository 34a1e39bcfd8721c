"""llama.cpp's logits and tokens on the converted dense fixtures: tests/fixtures/converted/dense_llamacpp.npz.

Run in a venv with llama-cpp-python (the pinned sdist of tools/make_converted_fixtures.py, built from source):
    python tools/make_dense_llamacpp_fixture.py

For each family's F32 target and drafter (the files tools/make_dense_fixtures.py wrote): the token text of
dense_hf.npz evaluated as cuca's test evaluates it (the 24-token prompt in one batch, then one token at a time),
every row's logits; and llama.cpp's tokenization (add_special, parse_special) of the strings in STRINGS.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "tests" / "fixtures" / "converted"
N_PROMPT = 24
STRINGS = [
    "Hello world! It's 2026: 1234567 apples, 3.14159 pies.",
    "  leading spaces\n\n\ttabs   and\r\nnewlines  ",
    "don't WON'T they'll I'M we've 12 123 1234",
    "Ünïcödé façade 日本語のテキスト 🤖🚀 ok",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "x=1;y=22;z=333;def f(a,b): return a+b  # sum",
]


def main() -> None:
    hf = np.load(DIR / "dense_hf.npz")
    out: dict[str, np.ndarray] = {"strings": np.array(STRINGS)}
    for family in ("qwen3", "qwen2", "llama3"):
        for role, name in (("target", f"{family}-f32"), ("drafter", f"{family}-draft-f32")):
            tokens = [int(t) for t in hf[f"{family}_{role}_tokens"]]
            llm = llama_cpp.Llama(str(DIR / f"{name}.gguf"), n_threads=1, n_ctx=128, logits_all=True, verbose=False)
            llm.eval(tokens[:N_PROMPT])
            rows = [np.array(llm.scores[:N_PROMPT], np.float32)]
            for t in tokens[N_PROMPT:]:
                llm.eval([t])
                rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens], np.float32))
            out[f"{family}_{role}_logits"] = np.concatenate(rows)
            if role == "target":
                for i, s in enumerate(STRINGS):
                    out[f"{family}_tokens_{i}"] = np.array(llm.tokenize(s.encode(), add_bos=True, special=True),
                                                           np.int32)
            del llm
    out["llama_cpp_version"] = np.array(llama_cpp.__version__)
    np.savez_compressed(DIR / "dense_llamacpp.npz", **out)
    print(f"wrote {DIR / 'dense_llamacpp.npz'}: llama-cpp-python {llama_cpp.__version__}")


if __name__ == "__main__":
    main()
