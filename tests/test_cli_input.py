"""The command line with hostile input and output (issue 13, defects 14 and 16, and 8's flag): stdin that is not
text, a path that is a device, a reader that closes the pipe, a context past the trained length."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synth import write_tiny

from cuca.cli import main


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("cli_input") / "tiny.gguf", arch="gemma3")


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="strict"))


# defect 14
def test_invalid_utf8_on_stdin_is_a_one_line_error(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, b"hello \xff world")
    rc = main(["run", str(path), "-", "--max-tokens", "3", "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "cuca: error: stdin is not valid utf-8 text (byte 0xff at offset 6)\n"


def test_chat_skips_a_line_that_is_not_text_and_goes_on(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stdin(monkeypatch, b"\xc3\x28 bad\nhello\n")
    rc = main(["chat", str(path), "--max-tokens", "3", "--threads", "1"])
    cap = capsys.readouterr()
    assert rc == 0 and "this line of stdin is not valid utf-8 text (byte 0xc3 at offset 0)" in cap.err
    assert "Traceback" not in cap.err and cap.err.count("finish:") == 1 and cap.out.endswith("\n")


# defect 16
def test_info_on_a_device_says_it_is_not_a_regular_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", os.devnull]) == 2
    assert "is not a regular file" in capsys.readouterr().err


def test_a_closed_stdout_pipe_exits_quietly(path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-m", "cuca.cli", "run", str(path), "hello", "--max-tokens", "40",
                          "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the first piece is written
    with p.stderr:
        err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == ""


# defect 8, on the command line
def test_a_context_past_the_trained_length_needs_the_flag(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", str(path), "--prompt", "hi", "--max-tokens", "3", "--threads", "1", "--context-length", "512"]
    assert main(argv) == 2 and "--allow-long-context" in capsys.readouterr().err
    assert main([*argv, "--allow-long-context", "--json"]) == 0 and '"n_generated": 3' in capsys.readouterr().out
