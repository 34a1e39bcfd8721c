"""The command line on tiny synthetic GGUF files: run, chat (stdin), info, pull (fake hub), one-line errors."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from fakehub import FakeHub, serve, use
from synth import write_tiny

from cuca import LocalModel, LocalModelConfig
from cuca.cli import file_info, main
from cuca.sources import PRESETS, Preset


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("cli") / "tiny.gguf", arch="gemma3")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_run_streams_text_then_one_summary_line(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["run", str(path), "abcabcabcabc", "--drafter", "prompt-lookup", "--draft-tokens", "4",
                         "--max-tokens", "12", "--threads", "1"], capsys)
    assert rc == 0 and out.endswith("\n") and len(out) > 1
    (line,) = err.strip().splitlines()
    assert "12 tokens at" in line and "tok/s" in line and "drafted" in line and "accepted" in line
    # the same text as the library, and options may come before the prompt
    m = LocalModel.load_sync(LocalModelConfig(path, threads=1))
    assert out[:-1] == m.complete_sync("abcabcabcabc", max_tokens=12).text
    rc, out2, err2 = _run(["run", "--max-tokens", "12", "--threads", "1", str(path), "abcabcabcabc"], capsys)
    assert rc == 0 and out2 == out and "drafted" not in err2  # no drafter: no acceptance figures


def test_run_reads_the_prompt_from_stdin_and_prints_json(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hello world"))
    rc, out, _ = _run(["run", str(path), "-", "--max-tokens", "5", "--threads", "1", "--json"], capsys)
    res = json.loads(out)
    assert rc == 0 and res["n_generated"] == 5 and res["n_prompt_tokens"] > 2 and res["finish_reason"] == "length"


def test_run_compare_measures_plain_decoding_in_the_same_run(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", str(path), "abcabcabcabc", "--drafter", "prompt-lookup", "--max-tokens", "10", "--threads", "1"]
    rc, out, err = _run(argv + ["--compare"], capsys)
    assert rc == 0 and "speedup" in err and "identical to plain decoding" in err and len(err.strip().splitlines()) == 2
    rc, out, _ = _run(argv + ["--compare", "--json"], capsys)
    res = json.loads(out)
    assert res["plain"]["identical"] is True and res["plain"]["speedup"] > 0 and res["draft"]["rounds"] > 0


def test_chat_keeps_the_conversation(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[dict[str, Any]]] = []
    real = LocalModel.chat_prompt

    def spy(self: LocalModel, messages: list[dict[str, Any]]) -> list[int]:
        seen.append([dict(m) for m in messages])
        return real(self, messages)

    monkeypatch.setattr(LocalModel, "chat_prompt", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n\nsecond\n/reset\nthird\n/exit\nnever read\n"))
    rc, out, err = _run(["chat", str(path), "--max-tokens", "4", "--threads", "1", "--system", "be brief"], capsys)
    assert rc == 0
    assert [[m["role"] for m in s] for s in seen] == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],  # the first exchange is kept
        ["system", "user"],  # after /reset
    ]
    assert [s[-1]["content"] for s in seen] == ["hello", "second", "third"]
    assert out.startswith(seen[1][2]["content"] + "\n")  # the reply that was streamed is what the history holds
    assert err.count("finish:") == 3 and "conversation cleared" in err


def test_chat_survives_a_context_overflow(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 200 + "\nhi\n"))
    rc, out, err = _run(["chat", str(path), "--max-tokens", "4", "--threads", "1", "--context-length", "64"], capsys)
    assert rc == 0 and "exceeds the context length" in err and "/reset" in err and err.count("finish:") == 1


def _write(path: Path, arch: str, keys: dict[str, int], tensors: list[str], template: bool = False) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in keys.items():
        w.add_uint32(k, v)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c", "d"])
    if template:
        w.add_chat_template("{{ messages }}")
    for name in tensors:
        w.add_tensor(name, np.zeros((4, 32), np.float32))
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_info_reports_heads_drafters_and_tensors(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = _run(["info", str(path)], capsys)
    assert rc == 0 and "architecture    gemma3" in out and "Q8_0" in out and "vocab 320" in out
    assert "chat template   no" in out and "prediction head none" in out
    q = _write(tmp_path / "q.gguf", "qwen35", {"qwen35.block_count": 2, "qwen35.nextn_predict_layers": 1},
               ["blk.1.nextn.eh_proj.weight", "blk.1.nextn.enorm.weight", "blk.0.attn_norm.weight"], template=True)
    info = file_info(q)
    assert info["has_prediction_head"] and "in-trunk" in info["prediction_head"] and "2 blk.*.nextn.*" in (
        info["prediction_head"]
    )
    assert info["tensors_by_type"] == {"F32": 3, "F16": 1} and info["vocab_size"] == 4 and info["chat_template"]
    assert info["tokenizer_model"] == "gpt2" and info["file_size"] == q.stat().st_size
    d = _write(tmp_path / "d.gguf", "gemma4-assistant", {"gemma4-assistant.block_count": 4}, ["blk.0.attn_q.weight"])
    rc, out, _ = _run(["info", str(d), "--json"], capsys)
    res = json.loads(out)
    assert rc == 0 and res["architecture"] == "gemma4-assistant" and "drafter" in res["prediction_head"]
    plain = _write(tmp_path / "p.gguf", "qwen35", {"qwen35.block_count": 1}, ["blk.0.attn_norm.weight"])
    assert not file_info(plain)["has_prediction_head"]


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(FakeHub()) as fake:
        use(fake, monkeypatch, tmp_path)
        yield fake


def test_pull_prints_the_cached_path_then_run_works_offline(
    hub: FakeHub, path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add("acme/tiny", "tiny.gguf", path.read_bytes())
    rc, out, _ = _run(["pull", "hf:acme/tiny/tiny.gguf"], capsys)
    got = Path(out.strip())
    assert rc == 0 and got.read_bytes() == path.read_bytes() and "models--acme--tiny" in str(got)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.log)
    rc, out, err = _run(["run", "hf:acme/tiny/tiny.gguf", "hello", "--max-tokens", "3", "--threads", "1"], capsys)
    assert rc == 0 and "3 tokens at" in err and len(hub.log) == n
    rc, _, err = _run(["pull", "hf:acme/tiny/other.gguf"], capsys)
    assert rc == 2 and "offline mode is on" in err


def test_presets_lists_every_preset_and_whether_it_is_here(
    hub: FakeHub, path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = Preset("test-preset", "gemma3", "acme/tiny", "tiny.gguf", size=path.stat().st_size)
    monkeypatch.setitem(PRESETS, p.name, p)
    hub.add("acme/tiny", "tiny.gguf", path.read_bytes())
    rc, out, _ = _run(["presets", "--json"], capsys)
    rows = {r["name"]: r for r in json.loads(out)}
    assert rc == 0 and {"gemma4-e2b-q4_0", "gemma4-e2b-mtp-f16", "qwen3.5-0.8b-q8_0"} <= set(rows)
    assert rows["gemma4-e2b-q4_0"]["drafter"] == "gemma4-e2b-mtp-q4_0"
    assert rows["qwen3.5-0.8b-q8_0"]["drafter"] == "in-trunk"
    assert rows["test-preset"]["local"] is False
    assert _run(["pull", "test-preset"], capsys)[0] == 0
    rc, out, _ = _run(["presets"], capsys)
    assert rc == 0 and out.splitlines()[0].startswith("preset") and "test-preset" in out
    assert json.loads(_run(["presets", "--json"], capsys)[1])[-1]["local"] is True


@pytest.mark.parametrize(
    "argv, says",
    [
        (["run", "/nonexistent/m.gguf", "hi"], "does not exist"),
        (["info", "gemma4-e2b-q4"], "did you mean 'gemma4-e2b-q4_0'"),
        (["pull", "hf:owner/repo"], "must name owner, repo and file"),
        (["run", "{path}", "hi", "--drafter", "prompt-lookup", "--draft-tokens", "0"], "draft_tokens"),
        (["run", "{path}", "hi", "--temperature", "-1"], "temperature"),
        (["run", "{path}", "hi", "--max-tokens", "0"], "max_tokens"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(
    argv: list[str], says: str, path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = _run([a.replace("{path}", str(path)) for a in argv], capsys)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("cuca: error: ")
