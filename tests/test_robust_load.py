"""Issue 13 regressions: hostile metadata and tensors are typed errors at load, never later and never untyped.

Files are a tiny valid model edited through the fuzzer's structural codec (tools/fuzz_gguf.py), so each case
changes exactly one thing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synth import write_tiny

from cuca import cli
from cuca.errors import GGUFError, TokenizerError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.gemma4_assistant import centroid_layout
from cuca.models.layers import Ops
from cuca.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import fuzz_gguf as fz  # noqa: E402
import synth_gemma4  # noqa: E402
import synth_qwen35  # noqa: E402

U32, I32, F32, BOOL, STR, ARR, U64, F64 = 4, 5, 6, 7, fz.STRING, fz.ARRAY, 10, 12
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("seeds")
    return {
        "llama": write_tiny(d / "llama.gguf", arch="llama").read_bytes(),
        "gemma3": write_tiny(d / "gemma3.gguf", arch="gemma3").read_bytes(),
        "gemma4": synth_gemma4.write_gemma4(d / "gemma4.gguf").read_bytes(),
        "qwen35": synth_qwen35.write(d / "qwen35.gguf", synth_qwen35.TINY).read_bytes(),
    }


def edited(tmp_path: Path, raw: bytes, edit: Any) -> Path:
    g = fz.parse(raw)
    edit(g)
    p = tmp_path / "edited.gguf"
    p.write_bytes(fz.build(g))
    return p


def with_kv(key: str, vtype: int, value: Any) -> Any:
    return lambda g: fz.set_kv(g, key, vtype, value)


def load(p: Path) -> Any:
    return load_model(open_gguf(p), Ops(threads=1))


# defect 5: each was a ValueError/TypeError/OverflowError/ZeroDivisionError at load on main, or loaded and failed in
# a kernel at the first request
@pytest.mark.parametrize("arch, key, typed, match", [
    ("llama", "embedding_length", (STR, b"abc"), "must be an integer"),
    ("llama", "block_count", (ARR, (U32, [2, 2])), "must be an integer"),
    ("llama", "attention.head_count", (U32, 0), "must be >= 1"),
    ("llama", "context_length", (F64, 1e300), "must be an integer"),
    ("llama", "feed_forward_length", (BOOL, True), "must be an integer"),
    ("llama", "rope.freq_base", (F32, NAN), "finite"),
    ("llama", "rope.freq_base", (F32, -1.0), ">="),
    ("llama", "rope.freq_base", (F64, 1e300), "<="),
    ("llama", "rope.dimension_count", (U32, 7), "even"),
    ("llama", "rope.dimension_count", (U32, 64), "<= 32"),
    ("llama", "attention.layer_norm_rms_epsilon", (F32, NAN), "finite"),
    ("llama", "attention.layer_norm_rms_epsilon", (F32, 0.0), ">="),
    ("llama", "attention.layer_norm_rms_epsilon", (STR, b"1e-6"), "must be a number"),
    ("llama", "rope.scaling.factor", (F32, INF), "finite"),
    ("gemma3", "attention.key_length", (U32, 0), "must be >= 1"),
    ("gemma3", "attention.sliding_window", (U32, 2**32 - 1), "<="),
    ("gemma3", "final_logit_softcapping", (F32, -1.0), ">="),
    ("gemma4", "attention.head_count", (ARR, (STR, [b"x"] * 10)), "must be an integer"),
    ("gemma4", "attention.sliding_window_pattern", (U32, 5), "must be an array"),
    ("gemma4", "attention.shared_kv_layers", (U32, 2**31), "<="),
    ("qwen35", "full_attention_interval", (U32, 0), "must be >= 1"),
    ("qwen35", "attention.key_length", (U32, 0), "must be >= 1"),
    ("qwen35", "ssm.conv_kernel", (I32, -3), ">= 1"),
])
def test_hostile_hyperparameters_are_gguf_errors_at_load(
    tmp_path: Path, seeds: dict[str, bytes], arch: str, key: str, typed: tuple[int, Any], match: str
) -> None:
    p = edited(tmp_path, seeds[arch], with_kv(f"{arch}.{key}", *typed))  # typed: (GGUF value type, value)
    with pytest.raises(GGUFError, match=match) as e:
        load(p)
    assert str(p) in str(e.value) and key in str(e.value)


def test_head_counts_must_divide(tmp_path: Path, seeds: dict[str, bytes]) -> None:
    p = edited(tmp_path, seeds["llama"], with_kv("llama.attention.head_count_kv", U32, 3))
    with pytest.raises(GGUFError, match="not a multiple of attention.head_count_kv 3"):
        load(p)


# defect 6: a layer count the tensors cannot back fails before any per-layer loop (qwen35 2^31 took 30+ s and GBs)
@pytest.mark.parametrize("arch, count", [("qwen35", 2**31), ("qwen35", 2**32 - 1), ("llama", 3), ("gemma3", 7),
                                         ("gemma4", 2**31 - 1)])
def test_layer_count_is_bounded_by_the_tensors_present(
    tmp_path: Path, seeds: dict[str, bytes], arch: str, count: int
) -> None:
    p = edited(tmp_path, seeds[arch], with_kv(f"{arch}.block_count", U32, count))
    with pytest.raises(GGUFError, match=r"block_count' must be <= \d+, got"):
        load(p)


# defect 5: general.alignment must be an integer power of two >= 8 (1 and 2 gave unaligned views, a BOOL passed)
@pytest.mark.parametrize("vtype, value", [(U32, 1), (U32, 2), (U32, 4), (U32, 0), (U32, 48), (BOOL, True),
                                          (F32, 32.0), (STR, b"32")])
def test_general_alignment_must_be_a_power_of_two_from_8(
    tmp_path: Path, seeds: dict[str, bytes], vtype: int, value: Any
) -> None:
    p = edited(tmp_path, seeds["llama"], with_kv("general.alignment", vtype, value))
    with pytest.raises(GGUFError, match="general.alignment"):
        open_gguf(p)


def test_general_alignment_8_and_64_still_load(tmp_path: Path, seeds: dict[str, bytes]) -> None:
    for a in (8, 64):
        g = fz.set_kv(fz.parse(seeds["llama"]), "general.alignment", U32, a)
        (tmp_path / f"a{a}.gguf").write_bytes(fz.build(g))
        (tmp_path / "seed.gguf").write_bytes(seeds["llama"])
        got, want = (open_gguf(tmp_path / n).tensor("token_embd.weight").data for n in (f"a{a}.gguf", "seed.gguf"))
        assert np.array_equal(got, want)  # the re-aligned file's tensors read back the same bytes


# defect 5: a 1-D weight in a block or integer type was read as raw bytes by layers.vector()
@pytest.mark.parametrize("ggml_type, name", [(8, "Q8_0"), (24, "I8")])
def test_norm_in_a_block_or_int_type_is_refused(
    tmp_path: Path, seeds: dict[str, bytes], ggml_type: int, name: str
) -> None:
    def edit(g: fz.Gguf) -> None:
        t = next(t for t in g.tensors if t.name == b"blk.0.attn_norm.weight")
        t.ggml_type = ggml_type  # the F32 data is longer than the new type needs: still inside the file

    p = edited(tmp_path, seeds["llama"], edit)
    with pytest.raises(GGUFError, match=f"'blk.0.attn_norm.weight' is stored as {name}; it must be F32 or F16"):
        load(p)


# defect 5: a vocabulary larger than token_embd's rows failed mid-request
def test_vocabulary_larger_than_the_embedding_is_refused_at_load(tmp_path: Path, seeds: dict[str, bytes]) -> None:
    def edit(g: fz.Gguf) -> None:
        kv = next(kv for kv in g.kvs if kv.key == b"tokenizer.ggml.tokens")
        kv.value = (kv.value[0], kv.value[1] + [b"extra%d" % i for i in range(8)])

    p = edited(tmp_path, seeds["llama"], edit)
    with pytest.raises(GGUFError, match="vocabulary has 328 tokens but token_embd.weight only 320 rows"):
        load(p)


# defect 13: duplicate keys were accepted silently (the last won); duplicate tensors are refused too
def test_duplicate_keys_and_tensors_are_refused(tmp_path: Path, seeds: dict[str, bytes]) -> None:
    p = edited(tmp_path, seeds["llama"], lambda g: g.kvs.append(fz.KV(b"llama.block_count", U32, 1)))
    with pytest.raises(GGUFError, match="duplicate metadata key 'llama.block_count'"):
        open_gguf(p)

    def dup_tensor(g: fz.Gguf) -> None:
        t = g.tensors[0]
        g.tensors.append(fz.Tensor(t.name, list(t.ne), t.ggml_type, t.offset))

    p = edited(tmp_path, seeds["llama"], dup_tensor)
    with pytest.raises(GGUFError, match="duplicate tensor"):
        open_gguf(p)


# the CLI: one line and exit code 2 for these, never a traceback
@pytest.mark.parametrize("key, vtype, value", [("llama.attention.head_count", U32, 0),
                                               ("llama.rope.freq_base", F32, NAN),
                                               ("llama.nextn_predict_layers", STR, b"x")])
def test_cli_reports_hostile_metadata_in_one_line(
    tmp_path: Path, seeds: dict[str, bytes], capsys: pytest.CaptureFixture[str], key: str, vtype: int, value: Any
) -> None:
    p = edited(tmp_path, seeds["llama"], with_kv(key, vtype, value))
    assert cli.main(["info", str(p)]) == 0  # info shows the file as it is
    capsys.readouterr()
    rc = cli.main(["run", str(p), "hello", "--max-tokens", "2"])
    err = capsys.readouterr().err
    if key.endswith("nextn_predict_layers"):  # not a llama key: ignored
        assert rc == 0
        return
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1 and key in err


def test_seeds_still_load_and_errors_stay_provider_errors(tmp_path: Path, seeds: dict[str, bytes]) -> None:
    for arch, raw in seeds.items():
        (tmp_path / f"{arch}.gguf").write_bytes(raw)
        assert load(tmp_path / f"{arch}.gguf").n_vocab > 0


# found while fuzzing: tokenizer metadata of the wrong type was a ValueError / TypeError
@pytest.mark.parametrize("arch, key, vtype, value", [("llama", "tokenizer.ggml.scores", ARR, (STR, [b"x"] * 320)),
                                                     ("qwen35", "tokenizer.ggml.pre", ARR, (STR, [b"qwen35"]))])
def test_tokenizer_metadata_of_the_wrong_type_is_a_tokenizer_error(
    tmp_path: Path, seeds: dict[str, bytes], arch: str, key: str, vtype: int, value: Any
) -> None:
    p = edited(tmp_path, seeds[arch], with_kv(key, vtype, value))
    with pytest.raises(TokenizerError, match=key.split(".")[-1]):
        Tokenizer.from_gguf(p).apply_chat_template([{"role": "user", "content": "hi"}])


# found in review: the centroid head's top-k was read untyped (a string was a ValueError, a float truncated)
@pytest.mark.parametrize("vtype, value, match", [(STR, b"32", "must be an integer"), (U32, 65, "<= 64")])
def test_centroid_top_k_is_read_typed_and_bounded(tmp_path: Path, vtype: int, value: Any, match: str) -> None:
    raw = (Path(__file__).parent / "fixtures" / "converted" / "assistant-centroids-f32.gguf").read_bytes()
    p = edited(tmp_path, raw, with_kv("gemma4-assistant.centroid_intermediate_top_k", vtype, value))
    with pytest.raises(GGUFError, match=match):
        centroid_layout(open_gguf(p))
