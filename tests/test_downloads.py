"""Downloads that must never cache wrong bytes (issue 13, defects 3 and 4), against the fake hub on 127.0.0.1: two
processes fetching one URL, the hub's own sha256 when the preset has none, partials validated before they are
resumed, and bodies whose end cannot be told from a break."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakehub import FakeHub, serve, use

from cuca import ModelSource
from cuca.errors import SourceError
from cuca.sources import PRESETS, Preset
from cuca.sources.download import url_cache_path


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(FakeHub()) as fake:
        use(fake, monkeypatch, tmp_path)
        yield fake


def _cached(tmp_path: Path, body: bytes) -> list[Path]:
    return [p for p in (tmp_path / "hf").rglob("*") if p.is_file() and p.read_bytes() == body]


# ---- defect 3: one URL, two processes -------------------------------------------------------------------------
CHILD = """
import sys, time
from pathlib import Path
from cuca.errors import SourceError
from cuca.sources.download import download_url
here = Path(sys.argv[2])
(here / f"ready-{sys.argv[3]}").touch()
t = time.monotonic()
while len(list(here.glob("ready-*"))) < 2 and time.monotonic() - t < 60:  # start together
    time.sleep(0.005)
try:
    print(download_url(sys.argv[1], sha256=sys.argv[4], progress=False))
except SourceError as e:
    print("SourceError", e)
    sys.exit(3)
"""


def test_two_processes_downloading_one_url_leave_one_good_file(hub: FakeHub, tmp_path: Path) -> None:
    body = os.urandom(1 << 20)
    sha = hashlib.sha256(body).hexdigest()
    hub.plain["m.gguf"] = body
    hub.hold["/files/m.gguf"] = 1.5  # a first GET waits for a second one: on main both processes download at once
    url = f"{hub.url}/files/m.gguf"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1,localhost")
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, url, str(tmp_path), str(i), sha], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [k.communicate(timeout=120) for k in kids]
    assert [k.returncode for k in kids] == [0, 0], outs
    final = url_cache_path(url)
    assert {o.strip() for o, _ in outs} == {str(final)}
    assert final.read_bytes() == body and (final.parent / "m.gguf.sha256").read_text().split()[0] == sha
    assert len(hub.gets("/files/m.gguf")) == 1  # the second process waited for the first and used its file
    assert not final.with_name("m.gguf.incomplete").exists()


# ---- defect 4: the hub's hash ---------------------------------------------------------------------------------
def _preset(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> str:
    p = Preset(**{"name": "test-preset", "architecture": "gemma3", "repo": "acme/tiny", "file": "tiny.gguf", **kw})
    monkeypatch.setitem(PRESETS, p.name, p)
    return p.name


def test_hub_files_are_checked_against_the_hubs_sha256_when_the_preset_has_none(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = bytes(range(256)) * 64
    sha = hub.add("acme/tiny", "tiny.gguf", body)
    name = _preset(monkeypatch)  # no sha256, no size
    blobs = tmp_path / "hf" / "hub" / "models--acme--tiny" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.cuca-incomplete").write_bytes(b"X" * 3000)  # a corrupt partial that a killed run left
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == body  # on main: 3000 X's were kept
    assert hub.gets("tiny.gguf") == ["bytes=3000-", None]  # resumed, failed the hub's hash, fetched whole

    bad = b"GGUF" + b"\x07" * 5000
    hub.add("acme/tiny", "other.gguf", bad)
    hub.etags[("acme/tiny", "other.gguf")] = hashlib.sha256(b"what was uploaded").hexdigest()  # bytes that differ
    with pytest.raises(SourceError, match="sha256 mismatch for hf:acme/tiny/other.gguf"):
        ModelSource.parse("hf:acme/tiny/other.gguf").resolve(progress=False)
    assert _cached(tmp_path, bad) == []


# ---- defect 4: URL partials -----------------------------------------------------------------------------------
def _partial(url: str, data: bytes, validator: str | None) -> Path:
    part = url_cache_path(url).with_name("m.gguf.incomplete")
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data)
    if validator is not None:
        part.with_name("m.gguf.incomplete.validator").write_text(validator + "\n")
    return part


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:16] + '"'  # what the fake hub's file server sends


def test_a_url_partial_longer_than_the_file_or_already_complete(hub: FakeHub, tmp_path: Path) -> None:
    body = bytes(range(256)) * 16
    hub.plain["m.gguf"] = body
    url = f"{hub.url}/files/m.gguf"
    _partial(url, body + b"stale tail", _etag(body))  # on main: 416, taken as complete, cached with the tail
    assert ModelSource.parse(url).resolve(progress=False).read_bytes() == body
    assert hub.gets("/files/m.gguf") == [f"bytes={len(body) + 10}-", None]
    url_cache_path(url).unlink()
    _partial(url, body, _etag(body))  # everything was there: the server confirms the size, nothing is fetched
    assert ModelSource.parse(url).resolve(progress=False).read_bytes() == body
    assert hub.gets("/files/m.gguf")[-1] == f"bytes={len(body)}-"


def test_a_url_partial_of_an_older_upload_is_not_spliced_into_the_new_one(hub: FakeHub, tmp_path: Path) -> None:
    old, new = b"A" * 8000, b"B" * 8000
    hub.plain["m.gguf"] = old
    hub.drop_after["/files/m.gguf"] = 3000
    url = f"{hub.url}/files/m.gguf"
    with pytest.raises(SourceError, match="run again to resume"):
        ModelSource.parse(url).resolve(progress=False)
    hub.plain["m.gguf"] = new  # re-uploaded between the two runs
    assert ModelSource.parse(url).resolve(progress=False).read_bytes() == new  # on main: 3000 A's + 5000 B's
    assert hub.gets("/files/m.gguf") == [None, "bytes=3000-"]  # asked with If-Range, got the whole new file

    url_cache_path(url).unlink()
    _partial(url, b"B" * 3000, None)  # a partial without a validator (an older cuca's): not resumed blindly
    assert ModelSource.parse(url).resolve(progress=False).read_bytes() == new
    assert hub.gets("/files/m.gguf")[-1] is None


def test_a_body_without_content_length_that_breaks_off_is_not_cached(hub: FakeHub, tmp_path: Path) -> None:
    body = bytes(range(256)) * 32
    sha = hashlib.sha256(body).hexdigest()
    hub.plain["m.gguf"] = body
    hub.no_length.add("/files/m.gguf")
    hub.drop_every["/files/m.gguf"] = 3000
    url = f"{hub.url}/files/m.gguf"
    with pytest.raises(SourceError, match="no Content-Length"):  # on main: 3000 bytes cached as the whole file
        ModelSource.parse(url).resolve(progress=False)
    assert _cached(tmp_path, body[:3000]) == [] and not url_cache_path(url).exists()
    with pytest.raises(SourceError, match="sha256 mismatch"):  # with a hash the length is not needed
        ModelSource.parse(f"{url}#sha256={sha}").resolve(progress=False)
    assert not url_cache_path(url).exists()
    hub.drop_every.clear()
    assert ModelSource.parse(f"{url}#sha256={sha}").resolve(progress=False).read_bytes() == body
