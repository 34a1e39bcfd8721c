"""ModelSource parsing, presets, and downloads against a local fake hub (no test reaches the internet)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants as hf_constants
import huggingface_hub.utils._http as hf_http
import pytest
from fakehub import FakeHub, NoSleep, serve, use
from synth import write_tiny

from cuca import LocalModel, LocalModelConfig, ModelSource
from cuca.errors import ProviderError, SourceError
from cuca.sources import PRESETS, Preset, paired_drafter
from cuca.sources.download import url_cache_path
from cuca.speculative.source import DrafterSource


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(FakeHub()) as fake:
        use(fake, monkeypatch, tmp_path)
        yield fake


def _preset(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> str:
    p = Preset(**{"name": "test-preset", "architecture": "gemma3", "repo": "acme/tiny", "file": "tiny.gguf", **kw})
    monkeypatch.setitem(PRESETS, p.name, p)
    return p.name


# ---- parsing ------------------------------------------------------------------------------------------------------
def test_parse_every_kind() -> None:
    assert ModelSource.parse("gemma4-e2b-q4_0").kind == "preset"
    s = ModelSource.parse("hf:unsloth/gemma-4-E2B-it-GGUF/MTP/mtp-gemma-4-E2B-it-F16.gguf@v1.0")
    assert (s.kind, s.repo, s.file, s.revision) == ("hf", "unsloth/gemma-4-E2B-it-GGUF",
                                                    "MTP/mtp-gemma-4-E2B-it-F16.gguf", "v1.0")
    assert ModelSource.parse("hf:a/b/c.gguf").revision is None
    u = ModelSource.parse("https://example.org/m/x.gguf#sha256=" + "AB" * 32)
    assert (u.kind, u.url, u.sha256) == ("url", "https://example.org/m/x.gguf", "ab" * 32)
    assert ModelSource.parse(Path("/tmp/m.gguf")).kind == "path"
    assert ModelSource.parse(s) is s
    assert str(s) == s.value
    assert ModelSource.hf("a/b", "c.gguf", "dev") == ModelSource.parse("hf:a/b/c.gguf@dev")


@pytest.mark.parametrize(
    "text, says",
    [
        ("hf:owner/repo", "must name owner, repo and file"),
        ("hf:owner/repo/model.bin", "not a .gguf file"),
        ("hf:owner/repo/m.gguf@", "empty revision"),
        ("hf:ow ner/repo/m.gguf", "not a valid repo id"),
        ("ftp://host/m.gguf", "only http:// and https://"),
        ("https://host/m.gguf#md5=00", "#sha256="),
        ("", "empty"),
    ],
)
def test_bad_sources_say_what_to_do(text: str, says: str) -> None:
    with pytest.raises(SourceError, match=says):
        ModelSource.parse(text)


def test_mistyped_preset_suggests_the_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match="did you mean 'gemma4-e2b-q4_0'"):
        ModelSource.parse("gemma4-e2b-q4").resolve()
    with pytest.raises(SourceError, match="is a directory"):
        ModelSource.parse(str(tmp_path)).resolve()


def test_config_accepts_a_string_wherever_a_source_is_expected(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "t.gguf", arch="gemma3")
    m = LocalModel.load_sync(LocalModelConfig(str(path), threads=1))
    assert m.path == path and m.source.kind == "path"


# ---- presets ------------------------------------------------------------------------------------------------------
def test_presets_are_frozen_data_and_pair_up() -> None:
    for name in ("gemma4-e2b-q4_0", "gemma4-e2b-mtp-f16", "qwen3.5-0.8b-q8_0", "gemma3-270m-q4_k_m",
                 "smollm2-135m-instruct-q4_1"):
        assert PRESETS[name].name == name
    with pytest.raises(AttributeError):
        PRESETS["gemma4-e2b-q4_0"].sha256 = "x"  # type: ignore[misc]
    assert PRESETS["gemma4-e2b-mtp-f16"].architecture == "gemma4-assistant"
    assert "gemma4-e2b-q4_0" in PRESETS["gemma4-e2b-mtp-f16"].pairs_with
    assert paired_drafter("gemma4-e2b-q4_0") == "gemma4-e2b-mtp-q4_0"
    assert paired_drafter("qwen3.5-0.8b-q8_0") == "in-trunk"
    assert paired_drafter("gemma3-270m-q4_k_m") is None and paired_drafter("nope") is None
    q = PRESETS["qwen3.5-0.8b-q8_0"]
    assert (q.repo, q.file, q.architecture) == ("unsloth/Qwen3.5-0.8B-MTP-GGUF", "Qwen3.5-0.8B-Q8_0.gguf", "qwen35")
    for p in PRESETS.values():  # a known hash is 64 hex digits; an unknown one is None, never a placeholder
        assert p.sha256 is None or (len(p.sha256) == 64 and int(p.sha256, 16) >= 0)
    # the pairing strings are what DrafterSource.parse understands
    assert DrafterSource.parse(paired_drafter("qwen3.5-0.8b-q8_0") or "") is DrafterSource.IN_TRUNK
    d = DrafterSource.parse(paired_drafter("gemma4-e2b-q4_0") or "")
    assert d.kind == "file" and d.source == ModelSource.parse("gemma4-e2b-mtp-q4_0")


# ---- downloads ----------------------------------------------------------------------------------------------------
def test_hub_reference_downloads_into_the_shared_cache(hub: FakeHub, tmp_path: Path) -> None:
    body = b"GGUF" + bytes(range(256)) * 40
    hub.add("acme/tiny", "sub/m.gguf", body)
    path = ModelSource.parse("hf:acme/tiny/sub/m.gguf").resolve(progress=False)
    assert path.read_bytes() == body
    assert tmp_path / "hf" / "hub" / "models--acme--tiny" in path.parents  # huggingface_hub's own layout
    n = len(hub.log)
    assert ModelSource.parse("hf:acme/tiny/sub/m.gguf").resolve(progress=False) == path
    assert not hub.gets("m.gguf")[1:] and len(hub.log) - n <= 1  # second time: at most a HEAD, no download
    assert ModelSource.parse("hf:acme/tiny/sub/m.gguf@main").resolve(progress=False) == path


def test_hub_errors_are_source_errors_that_say_what_to_do(hub: FakeHub) -> None:
    hub.add("acme/tiny", "m.gguf", b"GGUF")
    with pytest.raises(SourceError, match="repository 'acme/none' not found"):
        ModelSource.parse("hf:acme/none/m.gguf").resolve(progress=False)
    with pytest.raises(SourceError, match="file 'x.gguf' not found"):
        ModelSource.parse("hf:acme/tiny/x.gguf").resolve(progress=False)
    with pytest.raises(SourceError, match="revision 'v9' not found"):
        ModelSource.parse("hf:acme/tiny/m.gguf@v9").resolve(progress=False)
    with pytest.raises(SourceError, match="hf:acme/ti..ny/m.gguf"):  # a repo id the client itself refuses
        ModelSource.parse("hf:acme/ti..ny/m.gguf").resolve(progress=False)


def test_preset_download_verifies_sha256(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    body = b"GGUF" + b"\x01" * 3000
    sha = hub.add("acme/tiny", "tiny.gguf", body)
    name = _preset(monkeypatch, sha256=sha, size=len(body))
    path = ModelSource.parse(name).resolve(progress=False)
    assert path.read_bytes() == body
    assert ModelSource.preset(name).resolve(progress=False) == path  # cached: no re-download


def test_corrupted_download_is_rejected_and_not_left_in_the_cache(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    good = b"GGUF" + b"\x02" * 3000
    want = hashlib.sha256(good).hexdigest()
    bad = b"GGUF" + b"\x03" * 3000
    got = hub.add("acme/tiny", "tiny.gguf", bad)
    name = _preset(monkeypatch, sha256=want)
    with pytest.raises(SourceError, match=f"sha256 mismatch for hf:acme/tiny/tiny.gguf: expected {want}, got {got}"):
        ModelSource.parse(name).resolve(progress=False)
    left = [p for p in (tmp_path / "hf" / "hub").rglob("*") if p.is_file() and p.read_bytes() == bad]
    assert left == []
    hub.add("acme/tiny", "tiny.gguf", good)  # the upload is fixed: the next call downloads again and passes
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == good


def test_size_mismatch_is_rejected(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add("acme/tiny", "tiny.gguf", b"GGUF" * 10)
    name = _preset(monkeypatch, size=999)
    with pytest.raises(SourceError, match="size mismatch .* expected 999 bytes, got 40"):
        ModelSource.parse(name).resolve(progress=False)


def test_interrupted_hub_download_resumes_with_a_range_request(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = bytes(range(256)) * 64
    sha = hub.add("acme/tiny", "tiny.gguf", body)
    hub.drop_after["/acme/tiny/resolve/main/tiny.gguf"] = 5000
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 1024)  # so the bytes before the break are kept
    monkeypatch.setattr("huggingface_hub.file_download.time", NoSleep())
    name = _preset(monkeypatch, sha256=sha, size=len(body))
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == body
    ranges = hub.gets("tiny.gguf")
    assert ranges[0] is None and len(ranges) == 2 and ranges[1] is not None and ranges[1].startswith("bytes=")
    assert int(ranges[1][6:-1]) > 0  # the second request asked only for the rest


def test_a_hub_download_broken_off_in_one_run_resumes_in_the_next(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = bytes(range(256)) * 64
    sha = hub.add("acme/tiny", "tiny.gguf", body)
    hub.drop_after["/acme/tiny/resolve/main/tiny.gguf"] = 5000  # then the network goes down for the rest of the run
    hub.drop_every["/acme/tiny/resolve/main/tiny.gguf"] = 0
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 512)
    monkeypatch.setattr("huggingface_hub.file_download.time", NoSleep())
    name = _preset(monkeypatch, sha256=sha, size=len(body))
    with pytest.raises(SourceError, match="broke off at .* run the same command again to resume"):
        ModelSource.parse(name).resolve(progress=False)
    part = tmp_path / "hf" / "hub" / "models--acme--tiny" / "blobs" / f"{sha}.cuca-incomplete"
    kept = part.stat().st_size
    assert 0 < kept < len(body) and part.read_bytes() == body[:kept]
    del hub.drop_every["/acme/tiny/resolve/main/tiny.gguf"]  # the network is back: a new run continues
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == body
    assert hub.gets("tiny.gguf")[-1] == f"bytes={kept}-" and not part.exists()


def test_a_killed_hub_download_resumes_and_a_bad_one_never_enters_the_cache(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = bytes(range(256)) * 64
    sha = hub.add("acme/tiny", "tiny.gguf", body)
    blobs = tmp_path / "hf" / "hub" / "models--acme--tiny" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.cuca-incomplete").write_bytes(b"X" * 3000)  # what a killed run left, with wrong bytes
    name = _preset(monkeypatch, sha256=sha)
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == body  # resumed, rejected, fetched whole
    assert hub.gets("tiny.gguf") == ["bytes=3000-", None] and list(blobs.iterdir()) == [blobs / sha]

    def forget() -> None:
        for p in (tmp_path / "hf" / "hub").rglob("tiny.gguf"):
            p.resolve().unlink()
            p.unlink()

    forget()
    (blobs / f"{sha}.cuca-incomplete").write_bytes(b"X" * (len(body) + 1))  # longer than the file: start over
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == body
    assert hub.gets("tiny.gguf")[-1] is None
    forget()
    (blobs / f"{sha}.cuca-incomplete").write_bytes(body[:3000])  # the right bytes this time
    assert ModelSource.parse(name).resolve(progress=False).read_bytes() == body
    assert hub.gets("tiny.gguf")[-1] == "bytes=3000-"


def test_offline_mode_uses_the_cache_and_says_what_is_missing(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add("acme/tiny", "m.gguf", b"GGUF" * 100)
    path = ModelSource.parse("hf:acme/tiny/m.gguf").resolve(progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.log)
    assert ModelSource.parse("hf:acme/tiny/m.gguf").resolve(progress=False) == path
    with pytest.raises(SourceError, match="not in the cache .* offline mode is on .*cuca pull hf:acme/tiny/n.gguf"):
        ModelSource.parse("hf:acme/tiny/n.gguf").resolve(progress=False)
    with pytest.raises(SourceError, match="offline mode is on"):
        ModelSource.parse(f"{hub.url}/files/m.gguf").resolve(progress=False)
    assert len(hub.log) == n  # offline: not one request


def test_unreachable_hub_is_a_clear_error_and_the_cache_still_serves(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add("acme/tiny", "m.gguf", b"GGUF" * 100)
    path = ModelSource.parse("hf:acme/tiny/m.gguf").resolve(progress=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(hf_http, "time", NoSleep())
    assert ModelSource.parse("hf:acme/tiny/m.gguf").resolve(progress=False) == path
    with pytest.raises(SourceError, match="cannot reach the Hugging Face hub at http://127.0.0.1:9"):
        ModelSource.parse("hf:acme/tiny/other.gguf").resolve(progress=False)


def test_url_download_resumes_across_calls_and_verifies(hub: FakeHub) -> None:
    body = bytes(range(256)) * 32
    sha = hashlib.sha256(body).hexdigest()
    hub.plain["m.gguf"] = body
    hub.drop_after["/files/m.gguf"] = 3000
    src = ModelSource.parse(f"{hub.url}/files/m.gguf#sha256={sha}")
    with pytest.raises(SourceError, match="run again to resume"):
        src.resolve(progress=False)
    part = url_cache_path(src.url or "").with_name("m.gguf.incomplete")
    assert part.stat().st_size == 3000
    path = src.resolve(progress=False)
    assert path.read_bytes() == body and not part.exists()
    assert hub.gets("/files/m.gguf") == [None, "bytes=3000-"]
    assert src.resolve(progress=False) == path and len(hub.gets("/files/m.gguf")) == 2  # cached
    wrong = ModelSource.parse(f"{hub.url}/files/m.gguf#sha256={'1' * 64}")  # same file, another expected hash
    with pytest.raises(SourceError, match="sha256 mismatch"):
        wrong.resolve(progress=False)
    assert not path.exists() and src.resolve(progress=False).read_bytes() == body  # fetched again


def test_url_with_a_wrong_hash_is_not_kept(hub: FakeHub) -> None:
    hub.plain["m.gguf"] = b"GGUF" * 50
    src = ModelSource.parse(f"{hub.url}/files/m.gguf#sha256={'0' * 64}")
    with pytest.raises(SourceError, match="sha256 mismatch"):
        src.resolve(progress=False)
    assert not list(url_cache_path(src.url or "").parent.iterdir())
    with pytest.raises(SourceError, match="404"):
        ModelSource.parse(f"{hub.url}/files/none.gguf").resolve(progress=False)


def test_load_a_preset_through_the_fake_hub(hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body = write_tiny(tmp_path / "t.gguf", arch="gemma3").read_bytes()
    sha = hub.add("acme/tiny", "tiny.gguf", body)
    name = _preset(monkeypatch, sha256=sha, size=len(body))
    m = LocalModel.load_sync(LocalModelConfig(name, drafter="prompt-lookup", draft_tokens=3, threads=1))
    reply = m.complete_sync("abcabcabcabc", max_tokens=12)
    assert len(reply.tokens) == 12 and m.draft_stats().rounds > 0


def test_a_drafter_file_source_is_resolved_like_a_model(hub: FakeHub, tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "t.gguf", arch="gemma3")
    hub.add("acme/tiny", "d.gguf", b"GGUF")
    with pytest.raises(ProviderError):  # a gemma3 target has nothing a drafter file could pair with
        LocalModel.load_sync(LocalModelConfig(path, drafter="hf:acme/tiny/d.gguf", threads=1))
